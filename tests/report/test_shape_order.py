"""The reports order and group shape points by their sizes, read from the rows' text by ShapeSizes."""

from pipeline.catalog import ShapeSizes
from pipeline.report.rows import shape_order


def test_rows_sort_by_sequence_then_batch_with_no_point_and_static_first():
    shapes = ["4x512", None, "2x4096", "2x512", "static"]
    assert sorted(shapes, key=shape_order) == [None, "static", "2x512", "4x512", "2x4096"]


def test_a_points_batch_is_its_first_size():
    assert [ShapeSizes.parse(shape).batch for shape in ("2x512", "16x64", "8", "static")] == [2, 16, 8, None]
