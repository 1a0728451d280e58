"""The pure pieces of the anonymous overlay (ARCHITECTURE.md §3.2-3.3).

pathtable   relay state: link-ID tables, idle expiry, per-peer limits, replay filter, drop reasons
sealing     end-to-end seals of queries (to a model node's onion key) and replies (reply key)
reassembly  collecting the S-IDA cloves of one message until k of them decode

The shells are in the roles: the relay service in user_client.relay, the clove intake in
model_node.intake.
"""
