"""The Mesh port contract (the hub's side; a handshake needs a real peer)."""

from __future__ import annotations

from slurm_burst.ports import Mesh

KEY_A = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
KEY_B = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
KEY_C = "TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0="


class MeshContract:
    """Subclasses provide ``mesh``: a hub with no peers."""

    def test_the_hub_has_one_public_key(self, mesh: Mesh) -> None:
        key = mesh.ensure_hub()
        assert len(key) == 44 and key.endswith("=")
        assert mesh.ensure_hub() == key

    def test_peers_are_added_once_and_removed(self, mesh: Mesh) -> None:
        mesh.ensure_hub()
        mesh.add_peer(KEY_A, "10.66.0.2", "node-a")
        mesh.add_peer(KEY_A, "10.66.0.2", "node-a")  # again: still one
        mesh.add_peer(KEY_B, "10.66.0.3", "node-b")
        peers = {p.public_key: p for p in mesh.peers()}
        assert set(peers) == {KEY_A, KEY_B}
        assert peers[KEY_A].allowed_ips == ("10.66.0.2/32",)
        assert peers[KEY_A].comment == "node-a" and peers[KEY_A].latest_handshake == 0
        mesh.remove_peer(KEY_A)
        mesh.remove_peer(KEY_A)  # twice is fine
        mesh.remove_peer(KEY_C)  # never there: fine
        assert [p.public_key for p in mesh.peers()] == [KEY_B]
        mesh.remove_peer(KEY_B)

    def test_an_address_moves_to_its_new_holder(self, mesh: Mesh) -> None:
        mesh.ensure_hub()
        mesh.add_peer(KEY_A, "10.66.0.4", "node-a")
        mesh.add_peer(KEY_C, "10.66.0.4", "node-c")  # the address was released and reused
        assert [(p.public_key, p.allowed_ips) for p in mesh.peers()] == [(KEY_C, ("10.66.0.4/32",))]
        mesh.remove_peer(KEY_C)

    def test_a_node_config_names_the_hub_and_holds_no_private_key(self, mesh: Mesh) -> None:
        key = mesh.ensure_hub()
        conf = mesh.node_config(["10.66.0.0/24", "10.250.0.1/32"])
        assert f"PublicKey = {key}" in conf
        assert "AllowedIPs = 10.66.0.0/24, 10.250.0.1/32" in conf
        assert "Endpoint = " in conf and "PrivateKey" not in conf
