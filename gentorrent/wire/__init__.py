"""Generated gRPC/protobuf code of proto/ (do not edit by hand: `make proto`).

Import as ``from gentorrent.wire import gentorrent_pb2 as pb, gentorrent_pb2_grpc as rpc``.
"""
