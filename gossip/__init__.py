"""SWIM + Lifeguard membership: a sans-I/O protocol core (``protocol``), its wire format
(``codec``), encryption keys (``keyring``), and a thin asyncio shell (``transport``).

A node that names its mesh (the ``mesh`` metadata tag) refuses another mesh's members,
push-pulls and datagrams; its datagrams carry the mesh message (``codec.MESH``) to the peers
known to read it, so builds that predate optional message types keep working beside it."""

from gossip.config import Config
from gossip.events import EventKind, MemberEvent
from gossip.keyring import Keyring
from gossip.protocol import StreamRequest, Swim
from gossip.state import Addr, Member, NodeMeta, Status

__all__ = ["Addr", "Config", "EventKind", "Keyring", "Member", "MemberEvent", "NodeMeta",
           "Status", "StreamRequest", "Swim"]
