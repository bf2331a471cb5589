"""SWIM + Lifeguard membership: a sans-I/O protocol core (``protocol``), its wire format
(``codec``), encryption keys (``keyring``), and a thin asyncio shell (``transport``)."""

from gossip.config import Config
from gossip.events import EventKind, MemberEvent
from gossip.keyring import Keyring
from gossip.protocol import StreamRequest, Swim
from gossip.state import Addr, Member, NodeMeta, Status

__all__ = ["Addr", "Config", "EventKind", "Keyring", "Member", "MemberEvent", "NodeMeta",
           "Status", "StreamRequest", "Swim"]
