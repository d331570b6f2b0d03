"""Speculation: proposers, the token tree, verification, the tree budget, the prompt-lookup index."""
