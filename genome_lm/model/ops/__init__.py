"""Long-context ops: each `<op>/` keeps a plain reference (`naive.py`) beside the fast version."""
