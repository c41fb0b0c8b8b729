"""Which interface a worker's collectives bind to, and the reachability probe's answers."""

import socket

from dlscale.launch import netbind


def test_the_interface_holding_an_address_is_found_and_an_unknown_address_has_none():
    assert netbind.interface_for("127.0.0.1") == "lo"
    assert netbind.interface_for("203.0.113.77") is None  # TEST-NET-3: on no interface here
    assert netbind.interface_for("not an address") is None


def test_binding_names_the_interface_for_gloo_and_nccl_and_a_users_own_choice_wins():
    environ = {}
    assert netbind.bind_to("127.0.0.1", environ) == {
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "lo",
    }
    mine = {"GLOO_SOCKET_IFNAME": "eth7"}
    netbind.bind_to("127.0.0.1", mine)
    assert mine == {"GLOO_SOCKET_IFNAME": "eth7", "NCCL_SOCKET_IFNAME": "lo"}
    nothing = {}
    assert netbind.bind_to("203.0.113.77", nothing) == {} and nothing == {}


def test_a_listener_is_reached_without_accepting_and_a_closed_port_says_why():
    listener = netbind.Listener("127.0.0.1")
    try:
        assert netbind.reach("127.0.0.1", listener.port) is None
    finally:
        listener.close()
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    assert netbind.reach("127.0.0.1", closed, timeout=1) == "Connection refused"
