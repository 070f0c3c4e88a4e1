from pathlib import Path

import pytest

from synthetic import preset

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def tiny_cluster():
    """The SYNTHETIC tiny preset, seed 0, generated once per test session."""
    return preset("tiny", seed=0).generate()


@pytest.fixture(scope="session")
def sample(tiny_cluster):
    """3,000 flows of the tiny cluster (every 30th), with storage traffic among them."""
    return tiny_cluster.flows.iloc[::30].head(3000).reset_index(drop=True)


@pytest.fixture(scope="session")
def tiny_dir(tiny_cluster, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tiny_cluster.write(d)
    return d


@pytest.fixture
def data_dir():
    return DATA


@pytest.fixture(scope="module")
def cluster():
    """SYNTHETIC tiny cluster, 8 s: four jobs, a slow step, a slow server, a degraded switch (the daemon's tests' stream)."""
    return preset("tiny", seed=0, duration_s=8.0).generate()


@pytest.fixture(scope="module")
def broker():
    """A real Kafka-protocol broker (Tansu, in-memory storage) for one test module: the daemon's tests talk to it as
    to Apache Kafka; each module starts its own, so one module's topics and groups are never another's."""
    from prism.serve.broker import LocalBroker

    b = LocalBroker().start()
    yield b
    b.stop()
