"""The router's decision engine: a public model name's entry, its signals (and the embedding model they
use), its decisions, and the algorithms that turn the matching decision's candidates into a plan."""
