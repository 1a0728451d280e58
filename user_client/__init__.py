"""GenTorrent user_client package."""
