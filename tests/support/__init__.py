"""Helpers the tests share that are not fixtures: tiny checkpoints built offline, throw-away
encmap projects (params, git + DVC, running commands), and drivers for a headless browser, a
single-node SLURM cluster and an SFTP server on loopback."""
