"""The committed generated code matches proto/ (a stale build fails here)."""

from gentorrent.wire import generate


def test_generated_code_is_up_to_date():
    stale = generate.generated_matches_committed()
    assert stale == [], f"run `make proto`: stale generated files {stale}"


def test_generated_code_imports_on_installed_runtime():
    from gentorrent.wire import gentorrent_pb2 as pb, gentorrent_pb2_grpc as rpc

    msg = pb.Clove(link_id=b"x" * 16, payload=b"y")
    assert pb.Clove.FromString(msg.SerializeToString()) == msg
    assert hasattr(rpc, "RelayStub") and hasattr(rpc, "ModelNodeStub") and hasattr(rpc, "VerifierStub")
