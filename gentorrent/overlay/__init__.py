"""The anonymous overlay's pieces that both roles share (ARCHITECTURE.md §3.2-3.3).

Pure (no I/O, time passed in):

pathtable   relay state: link-ID tables, idle expiry, per-peer limits, replay windows, drop reasons
sealing     end-to-end seals: query envelopes (to a model node's onion key) and replies (reply key)
reassembly  collecting the S-IDA cloves of one message until k of them decode; the model node's asks

The one shell: links (one long-lived, authenticated gRPC stream per neighbour, hop-local acks).
The roles' shells sit on it: the relay service in user_client.relay, the clove intake in
model_node.intake.
"""
