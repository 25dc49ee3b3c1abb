"""The runtime every target shares, naming no framework and no kind: acquisition of a pin's code
into the cache (`acquire`, `wheels`, `gitrepo`, `cache`), local mirrors (`repos`), the isolated
worker and the fork server it starts from (`worker`, `forkserver`, `client`), inert stand-ins for
heavy modules the math never touches (`standins`), and `session`, which opens a target@pin."""
