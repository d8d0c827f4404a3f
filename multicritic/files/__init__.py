"""The critic's files: sealed weight files, checkpoint integrity, exports and the runtimes that serve them."""
