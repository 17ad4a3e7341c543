"""GrayRelease tooling for users: the `tinct release` command and its dye matrix."""
