import pytest
from onnx import TensorProto, helper

from pipeline.report.roofline import matmul_flops, peak_tflops


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_matmul_and_conv_flops_are_counted_from_shapes():
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], [0.0] * 12)
    k = helper.make_tensor("k", TensorProto.FLOAT, [8, 3, 2, 2], [0.0] * 96)
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Conv", ["img", "k"], ["z"], strides=[2, 2])],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 3]),
            helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 4, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None), helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [w, k],
    )
    # MatMul [2,5,3]x[3,4]: 2*(2*5*4)*3 = 240; Conv to [1,8,2,2] with 3*2*2 inputs each: 2*32*12 = 768.
    assert matmul_flops(model) == 240 + 768


def test_unknown_shapes_give_no_flops():
    model = _model(
        [helper.make_node("MatMul", ["x", "y"], ["z"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]), helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
    )
    assert matmul_flops(model) is None


def test_peaks_are_known_for_listed_gpus_only():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp16") == pytest.approx(989.4)
    assert peak_tflops("NVIDIA H100 80GB HBM3", "nvfp4") is None
    assert peak_tflops("NVIDIA RTX 6000 Ada Generation", "fp16") is None
    assert peak_tflops(None, "fp16") is None
