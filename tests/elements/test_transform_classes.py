"""Transforms as classes (issue 16 item 2): ours, Grain's own, and any object with the
method; a wrong-shaped transform is refused when the pipeline is built."""

from __future__ import annotations

import json

import grain
import numpy as np
import pytest

import aioloader as al
from aioloader.elements import transforms as T

from ..runtime.test_pipeline import _write


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("classes"), n=300)


class Parse(T.Map):
    def map(self, element):
        return json.loads(element)


class GrainId(grain.transforms.Map):
    def map(self, element):
        return np.int64(element["id"])


class GrainNoise(grain.transforms.RandomMap):
    def random_map(self, element, rng):
        return element * 1000 + int(rng.integers(0, 1000))


class GrainEven(grain.transforms.Filter):
    def filter(self, element):
        return element % 2 == 0


class Shaped:  # no base class: the method is enough
    def map(self, element):
        return element + 1


def _functions(data):
    return (al.Dataset.from_arrayrecord(data).shuffle(5).map(json.loads)
            .map(lambda e: np.int64(e["id"])).filter(lambda i: i % 2 == 0)
            .random_map(lambda i, rng: i * 1000 + int(rng.integers(0, 1000)))
            .map(lambda i: i + 1))


def _classes(data):
    return (al.Dataset.from_arrayrecord(data).shuffle(5).map(Parse()).map(GrainId())
            .filter(GrainEven()).random_map(GrainNoise()).map(Shaped()))


@pytest.mark.parametrize("workers", [0, 2])
def test_class_transforms_give_what_the_same_functions_give(data, workers):
    got = [int(x) for x in _classes(data).loader(workers=workers)]
    assert got == [int(x) for x in _functions(data).loader(workers=0)]
    assert len(got) == 150 and all((x - 1) // 1000 % 2 == 0 for x in got)


def test_the_pipeline_names_the_class_method(data):
    assert "map(Parse.map)" in " ".join(_classes(data).describe())


@pytest.mark.parametrize(("verb", "obj", "says"), [
    ("map", GrainEven(), r"\.map\(\) takes a function or an object with a `map` method, "
                         r"got GrainEven; it has `filter`: use \.filter\(\)"),
    ("filter", Parse(), r"got Parse; it has `map`: use \.map\(\)"),
    ("random_map", 3, r"`random_map` method, got int"),
    ("map", Parse, r"got the class Parse; pass an instance: Parse\(\)"),
])
def test_a_wrong_shaped_transform_is_refused_when_built(data, verb, obj, says):
    ds = al.Dataset.from_arrayrecord(data)
    with pytest.raises(TypeError, match=says):
        getattr(ds, verb)(obj)


def test_the_base_classes_require_their_method():
    class Empty(T.Map):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Empty()


@pytest.mark.parametrize(("verb", "fn", "says"), [
    ("random_map", lambda x: x, r"\.random_map\(\) calls <lambda>\(element, rng\), but "
                                r"<lambda>\(x\) cannot be called so"),
    ("map", lambda x, rng: x, r"\.map\(\) calls <lambda>\(element\)"),
    ("filter", lambda: True, r"\.filter\(\) calls <lambda>\(element\)"),
])
def test_a_function_that_cannot_take_the_verbs_arguments_is_refused_when_built(data, verb, fn,
                                                                              says):
    with pytest.raises(TypeError, match=says):
        getattr(al.Dataset.from_arrayrecord(data), verb)(fn)


def test_a_transform_class_with_the_wrong_method_signature_is_refused():
    class OneArg(T.RandomMap):
        def random_map(self, element):  # forgot rng
            return element

    with pytest.raises(TypeError, match=r"OneArg.random_map\(element, rng\)"):
        al.Dataset.from_arrayrecord("unused.array_record").random_map(OneArg())


def test_functions_without_a_signature_and_extra_defaults_are_accepted():
    ds = al.Dataset.from_arrayrecord("unused.array_record")
    ds.map(int).map(np.asarray).filter(bool)
    ds.random_map(lambda x, rng, scale=2: x * scale)


def test_the_base_classes_are_public_and_flat_map_has_one_for_later():
    assert (al.Map, al.RandomMap, al.Filter, al.FlatMap) == (T.Map, T.RandomMap, T.Filter,
                                                             T.FlatMap)

    class Split(al.FlatMap):
        def flat_map(self, element):
            return element.split()

    assert Split().flat_map("a b") == ["a", "b"]
    with pytest.raises(TypeError, match="abstract"):
        type("Empty", (al.FlatMap,), {})()
    with pytest.raises(TypeError, match=r"it has `flat_map`: use \.flat_map\(\)"):
        al.Dataset.from_arrayrecord("unused.array_record").map(Split())
