"""The anonymous overlay (DESIGN.md §3.2-3.3).

pathtable   relay state: link-ID tables, idle expiry, per-peer limits, replay filter, drop reasons
relay       the Relay gRPC service every user node runs (Establish, Forward, Return)
sealing     end-to-end seals of queries (to a model node's onion key) and replies (reply key)
reassembly  collecting the S-IDA cloves of one message until k of them decode
intake      the model node's clove intake: cloves in, reply cloves out to the proxies
channels    cached pinned-TLS channels to peers
"""
