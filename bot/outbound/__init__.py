"""What goes out: the outbound budget's pacing (`pacing`, `pacer`), live drafts (`drafts`), a
reply cut into parts (`split`) and the typing indicator (`typing_indicator`). The core hands
it finished words; it hands the adapter paced calls.
"""

__all__ = ["drafts", "pacer", "pacing", "split", "typing_indicator"]
