"""The engine: runs generations of token ids round by round (`round.py` holds the round's
contract: propose -> verify -> accept -> rollback), and counts what happened (`metrics.py`)."""
