"""A wide-area network in a box for the devnet (`gt-devnet up --wan PROFILE`).

Every node runs in its own network namespace; the namespaces' only way out is one TUN device
each, whose other end is the link emulator (`emulator`), a user-space router that delays,
jitters, drops and rate-limits every packet by the profile (`profiles`) with decisions taken
by a pure, seeded core (`links`); `namespaces` makes and removes the namespaces, the NAT
routers of the nodes behind NAT, and the management network the operator reaches the nodes'
local APIs by. ARCHITECTURE.md §8 ("The WAN in a box").
"""
