module tinct.io/testenv/pause

go 1.26.0
