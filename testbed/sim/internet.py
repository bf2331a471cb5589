"""An Internet-like latency topology for Vivaldi: regions on a globe, access links, detours, jitter.

Serf's phantom topologies (``testbed.sim.vivaldi``) are exact geometries; this one is meant to
look like the wide-area RTTs a mesh agent actually sees, so that "how accurate are the
coordinates" has an answer comparable with the Vivaldi paper (11% median relative error on the
King data set of real Internet RTTs).  Nothing here is fitted to make Vivaldi look good: every
constant below is set from a physical or published order of magnitude, documented where it is
defined.

The true RTT of a pair of nodes ``i``, ``j`` (seconds, symmetric, noiseless) is::

    truth[i][j] = (ROUTE_FACTOR * fiber_rtt(i, j) + CORE_OVERHEAD) * detour[i][j]
                  + access[i] + access[j]

* ``fiber_rtt``: the great-circle distance between the two nodes' locations, there and back, at
  the speed of light in fiber (``FIBER_SPEED``, 2/3 c).  A node's location is its region's city
  (``REGIONS``) plus a Gaussian offset of ``METRO_SPREAD_KM`` per axis.
* ``ROUTE_FACTOR`` and ``CORE_OVERHEAD``: cables are longer than the great circle, and every
  path crosses routers.
* ``detour``: a per-pair routing inflation >= 1 (BGP picks policy routes, not shortest ones),
  drawn independently for every pair, so the matrix violates the triangle inequality and no
  embedding can fit it exactly.
* ``access``: each node's access link (NIC, LAN, last mile), crossed by every packet it sends
  or receives: Vivaldi's "height".  Heavy-tailed: most hosts are well connected, a few sit
  behind DSL/cable/Wi-Fi.

``sample_rtt`` turns a true RTT into one measurement: small symmetric jitter and, rarely, a
queueing spike (the kind of outlier the client's median-of-3 latency filter is meant to strip).
The truth is the RTT a typical packet sees, so evaluation compares estimates with the
noiseless matrix.

With the defaults, a typical pair between two region cities (median detour, two 1 ms access
links) sees from ~12 ms (London-Frankfurt) to ~270 ms (Tokyo-Sao Paulo); see ``region_rtts``.
Same-region pairs: p10/median/p90 ~4/6/11 ms; cross-region ~74/142/240 ms.
"""

from __future__ import annotations

import math
import random

from testbed.sim import vivaldi
from testbed.sim.vivaldi import Matrix
from topology.client import VivaldiClient

REGIONS: dict[str, tuple[float, float, float]] = {
    # name: (latitude, longitude, share of the nodes)
    "us-east": (39.04, -77.49, 0.20),       # Ashburn, Virginia
    "us-west": (37.34, -121.89, 0.15),      # San Jose, California
    "eu-west": (51.51, -0.13, 0.12),        # London
    "eu-central": (50.11, 8.68, 0.15),      # Frankfurt
    "ap-northeast": (35.68, 139.69, 0.10),  # Tokyo
    "ap-southeast": (1.35, 103.82, 0.10),   # Singapore
    "au-southeast": (-33.87, 151.21, 0.08),  # Sydney
    "sa-east": (-23.55, -46.63, 0.10),      # Sao Paulo
}
"""Eight regions at the cities where public clouds and IXPs concentrate capacity.  Shares are
uneven (more nodes in North America and Europe) as in real fleets; each node's region is drawn
independently with these weights."""

EARTH_RADIUS_KM = 6371.0
FIBER_SPEED_KM_S = 299_792.458 * 2.0 / 3.0
"""Light in silica fiber (refractive index ~1.47-1.5): about 2/3 c, 200 km per ms."""

ROUTE_FACTOR = 1.3
"""Cable length over great-circle distance (cables follow coasts, roads and sea-floor routes).
With it, a typical pair between two region cities (median detour, two 1 ms access links) lands
near public inter-region pings: Ashburn-Frankfurt ~97 ms (measured ~90), Ashburn-San Jose
~58 ms (~62), Tokyo-Singapore ~80 ms (~70), Ashburn-Sao Paulo ~113 ms (~115), Sydney-Singapore
~94 ms (~92).  Great circles *underestimate* the long hauls that really go around a continent
or through a hub (Sao Paulo-Singapore ~330 ms in practice, ~233 ms here; Frankfurt-Tokyo ~230
vs ~137): at the region level this model is more Euclidean than the real Internet, and the
per-pair detours below are what breaks the geometry."""

CORE_OVERHEAD = 0.001
"""Router, switch and serialization delay on any wide-area path, seconds of RTT.  Makes short
paths relatively more inflated than long ones, as measured (London-Frankfurt is ~2x its
fiber RTT, trans-oceanic paths ~1.3x)."""

METRO_SPREAD_KM = 100.0
"""Standard deviation, per east/north axis, of a node's distance from its region's city: a
region is a metro area plus nearby sites (us-east spans Virginia to New York).  Two nodes of
one region are then ~180 km apart on average: a few ms of RTT once detours and access links
are added."""

DETOUR_SIGMA = 0.15
"""Per-pair routing inflation ``exp(DETOUR_SIGMA * |Z|)``, Z standard normal: always >= 1,
median 1.11, p90 1.28, p99 1.47.  Independent per pair, which is the worst case for an
embedding (real detours are partly shared by nodes behind the same ISP)."""

ACCESS_MEDIAN = 0.001
ACCESS_SIGMA = 1.0
"""Access-link RTT per node, lognormal: median 1 ms, p90 3.6 ms, p99 10 ms; about 5% of the
nodes above 5 ms (DSL, cable, Wi-Fi, a congested uplink), the slowest of 500 around 20 ms."""

JITTER_SIGMA = 0.02
"""Per-sample multiplicative jitter ``exp(N(0, JITTER_SIGMA))``: about 2% either way
(scheduling on both hosts, timer resolution, queueing that comes and goes)."""

SPIKE_PROBABILITY = 0.02
SPIKE_RANGE = (0.005, 0.050)
"""2% of samples also wait in a full queue somewhere: + uniform 5-50 ms, added to the jittered
RTT.  One-sided, as queueing is."""


def great_circle_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Haversine distance in km between two points given in degrees."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def core_rtt(km: float) -> float:
    """RTT in seconds of the wide-area part of a path of great-circle length ``km``, before
    the per-pair detour."""
    return ROUTE_FACTOR * 2.0 * km / FIBER_SPEED_KM_S + CORE_OVERHEAD


def region_rtts() -> dict[tuple[str, str], float]:
    """Core RTT between every two region cities (no detour, no access links), for reference."""
    names = list(REGIONS)
    return {(a, b): core_rtt(great_circle_km(*REGIONS[a][:2], *REGIONS[b][:2]))
            for i, a in enumerate(names) for b in names[i + 1:]}


def _place(lat: float, lon: float, rng: random.Random) -> tuple[float, float]:
    """A point around (lat, lon) with a Gaussian offset of ``METRO_SPREAD_KM`` per axis."""
    east, north = rng.gauss(0.0, METRO_SPREAD_KM), rng.gauss(0.0, METRO_SPREAD_KM)
    km_per_degree = math.pi * EARTH_RADIUS_KM / 180.0
    return (lat + north / km_per_degree,
            lon + east / (km_per_degree * math.cos(math.radians(lat))))


def generate(n: int = 500, rng: random.Random | None = None) -> tuple[Matrix, list[str]]:
    """An ``n``-node topology: the noiseless RTT matrix (seconds) and each node's region.

    Everything is drawn from ``rng`` (a fresh ``random.Random(0)`` if None), in a fixed order,
    so one seed gives one topology.
    """
    rng = rng or random.Random(0)
    names = list(REGIONS)
    regions = rng.choices(names, weights=[REGIONS[r][2] for r in names], k=n)
    places = [_place(*REGIONS[r][:2], rng) for r in regions]
    access = [ACCESS_MEDIAN * math.exp(rng.gauss(0.0, ACCESS_SIGMA)) for _ in range(n)]
    truth = [[0.0] * n for _ in range(n)]
    for i in range(n):
        row = truth[i]
        for j in range(i + 1, n):
            detour = math.exp(DETOUR_SIGMA * abs(rng.gauss(0.0, 1.0)))
            core = core_rtt(great_circle_km(*places[i], *places[j]))
            row[j] = truth[j][i] = core * detour + access[i] + access[j]
    return truth, regions


def sample_rtt(truth: Matrix, i: int, j: int, rng: random.Random) -> float:
    """One noisy measurement of the RTT between ``i`` and ``j``, in seconds."""
    rtt = truth[i][j] * math.exp(rng.gauss(0.0, JITTER_SIGMA))
    if rng.random() < SPIKE_PROBABILITY:
        rtt += rng.uniform(*SPIKE_RANGE)
    return rtt


def simulate(nodes: list[VivaldiClient], truth: Matrix, cycles: int,
             rng: random.Random) -> None:
    """Serf's ``Simulate`` loop with noisy measurements (``sample_rtt``)."""
    vivaldi.simulate(nodes, truth, cycles, rng, sample_rtt)
