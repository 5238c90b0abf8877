"""A model's shape point: the catalog's text read as a size per named axis, and written back."""

import pytest

from pipeline.models import ShapePoint
from pipeline.running.errors import UsageError


def test_a_catalog_shape_is_a_size_per_axis_and_writes_back_as_its_text():
    point = ShapePoint.parse("2x512", ("batch", "sequence"), "bert")
    assert point.as_dict() == {"batch": 2, "sequence": 512}
    assert point.label == "2x512" and str(point) == "2x512"
    assert ShapePoint(()).label == "static"


def test_a_shape_with_another_number_of_sizes_than_the_model_has_axes_is_a_usage_error():
    with pytest.raises(UsageError, match=r"shape '2' has 1 size\(s\), but the model's dynamic axes are batch × sequence"):
        ShapePoint.parse("2", ("batch", "sequence"), "bert")


def test_a_shape_that_is_not_sizes_is_refused():
    with pytest.raises(ValueError, match="is not a shape"):
        ShapePoint.parse("2xbig", ("batch", "sequence"), "bert")
