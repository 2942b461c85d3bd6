"""components/compat.py: Beam's DoFn introspection, answered once per DoFn instance and the same as Beam's."""
import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import userstate

from components.compat import cache_dofn_specs


class Counting(beam.DoFn):
    COUNT = userstate.ReadModifyWriteStateSpec("count", VarIntCoder())

    def process(self, element, count=beam.DoFn.StateParam(COUNT)):  # noqa: B008  (Beam's way of declaring state)
        yield element


class Plain(beam.DoFn):
    def process(self, element):
        yield element


def test_the_cache_gives_beams_answer_and_asks_once_per_instance(monkeypatch):
    asked = []
    original = userstate.get_dofn_specs

    def counting(dofn):
        asked.append(dofn)
        return original(dofn)

    counting.__module__ = original.__module__
    monkeypatch.setattr(userstate, "get_dofn_specs", counting)
    assert cache_dofn_specs()
    stateful, plain = Counting(), Plain()
    for _ in range(3):
        assert userstate.get_dofn_specs(stateful) == ({Counting.COUNT}, set())
        assert userstate.get_dofn_specs(plain) == (set(), set())
        assert userstate.is_stateful_dofn(stateful) and not userstate.is_stateful_dofn(plain)
    assert asked == [stateful, plain]
    # Another instance is asked about on its own; installing twice keeps one cache.
    assert cache_dofn_specs() and userstate.get_dofn_specs(Counting()) == ({Counting.COUNT}, set())
    assert len(asked) == 3


def test_an_unexpected_function_is_left_alone(monkeypatch):
    def other(dofn, extra=None):
        return set(), set()

    monkeypatch.setattr(userstate, "get_dofn_specs", other)
    assert not cache_dofn_specs()
    assert userstate.get_dofn_specs is other
