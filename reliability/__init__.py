"""Tickgate's reliability runs: the soak (`python -m reliability.soak`), which judges that
every tick is accounted for over a long run under faults. See reliability/README.md.
"""
