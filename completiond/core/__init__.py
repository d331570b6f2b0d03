"""The engine: prompt, proposers, token tree, target passes, verification."""
