"""The dye-tag data plane: classify, choose, proxy, fall back, measure."""
