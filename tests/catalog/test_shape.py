"""A shape point's text is read in one place (pipeline/catalog/shape.py): its sizes, the text
written back, the order points sort in, and what is not a shape."""

import pytest

from pipeline.catalog import STATIC_SHAPE, ShapeSizes, check_shape


@pytest.mark.parametrize("text", ["2x512", "1", "16x4096x8", "128x1", STATIC_SHAPE])
def test_a_point_reads_back_as_the_text_it_was_read_from(text):
    point = ShapeSizes.parse(text)
    assert point.label == text and str(point) == text
    assert ShapeSizes.parse(point.label) == point


def test_a_point_names_its_batch_and_sequence_where_it_has_them():
    point = ShapeSizes.parse("2x512")
    assert (point.sizes, point.batch, point.sequence) == ((2, 512), 2, 512)
    assert (ShapeSizes.parse("8").batch, ShapeSizes.parse("8").sequence) == (8, None)
    static = ShapeSizes.parse("static")
    assert (static.sizes, static.batch, static.sequence) == ((), None, None)


def test_a_point_of_three_axes_grows_along_its_last_and_holds_the_others():
    """batch × frames × sequence: the sequence is the last size, not the frames; a sweep holds the
    batch and the frames while it grows. A point of one axis holds its batch: it has no sequence."""
    point = ShapeSizes.parse("2x3x8")
    assert (point.batch, point.sequence, point.held) == (2, 8, (2, 3))
    assert ShapeSizes.parse("2x512").held == (2,) and ShapeSizes.parse("8").held == (8,) and ShapeSizes.parse("static").held == ()


def test_points_sort_by_sequence_then_batch_with_static_first():
    texts = ["4x512", "2x2048", "static", "2x512", "1x2048"]
    assert sorted(texts, key=lambda text: ShapeSizes.parse(text).order) == ["static", "2x512", "4x512", "1x2048", "2x2048"]


@pytest.mark.parametrize("text", ["", "2x", "x512", "0x512", "02x512", "2×512", "2X512", "2x-1", "two", " 2x512", None, 2])
def test_what_is_not_a_shape_is_a_value_error_saying_how_one_is_written(text):
    with pytest.raises(ValueError, match="is not a shape: write the sizes of the model's dynamic axes joined by 'x'"):
        ShapeSizes.parse(text)


def test_the_catalog_lists_sizes_only_never_static():
    assert check_shape("2x512") == "2x512"
    with pytest.raises(ValueError, match="'static' is not a shape"):
        check_shape(STATIC_SHAPE)
    with pytest.raises(ValueError, match="is not a shape"):
        ShapeSizes.parse(STATIC_SHAPE, static=False)


def test_the_printed_form_and_back():
    from pipeline.catalog.shape import shown, written

    assert shown("2x512") == "2×512" == ShapeSizes.parse("2x512").shown and shown(None) == "" and shown("static") == "static"
    assert written("2×512") == "2x512" == written("2x512")
    assert ShapeSizes.parse(written(shown("4x4096"))).label == "4x4096"


def test_a_tensors_dimensions_as_tensorrts_tools_write_them():
    from pipeline.catalog.shape import tensor_dims

    assert tensor_dims("1x3x224x224") == [1, 3, 224, 224] and tensor_dims("") == [] and tensor_dims("0x8") == [0, 8]
