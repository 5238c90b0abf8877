"""NVFP4 graphs a strongly typed TensorRT build accepts, repaired after ModelOpt's exporter.

ModelOpt 0.47's clean-up of an FP16-traced NVFP4 graph drops casts it believes redundant, reading
types recorded before the graph changed; what is left mixes FP16 and FP32 where TensorRT's
strongly typed parser needs one type per operation.
"""

from __future__ import annotations

_SAME_TYPE_OPS = {"Transpose", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten"}


def make_fp4_graph_consistent(model, weights_dtype: str) -> int:
    """Make ModelOpt's NVFP4 graph one a strongly typed TensorRT build accepts; returns the casts added.

    ModelOpt 0.47's NVFP4 exporter dequantizes FP4 weights to FP32 and casts both inputs of each
    FP4 matrix multiply to FP16, then its redundant-cast clean-up reads a type recorded before the
    weights were replaced and drops the weight's cast whenever the traced model was FP16. What
    comes out mixes types, and TensorRT's parser refuses it ("ElementWiseOperation SUM must have
    same input types ... Float and Half" at the first bias add of an FP32 graph; "IMatrixMultiply-
    Layer must have same input types" at the first FP4 MatMul of an FP16 one). Here, each MatMul
    fed by an FP4 dequantization gets FP16 on both inputs, and in an FP32 graph its result goes
    back to FP32 for the bias add that follows. Weights that ModelOpt also lists as graph inputs
    stop being inputs: they are initializers, and an input is something the caller feeds.
    """
    from onnx import TensorProto, helper

    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    initializer_types = {tensor.name: tensor.data_type for tensor in graph.initializer}
    input_types = {value.name: value.type.tensor_type.elem_type for value in graph.input}

    def dtype_of(name: str) -> int | None:
        if name in initializer_types:
            return initializer_types[name]
        if name in input_types:
            return input_types[name]
        node = producers.get(name)
        if node is None:
            return None
        if node.op_type == "Cast":
            return next(helper.get_attribute_value(a) for a in node.attribute if a.name == "to")
        if node.op_type == "DequantizeLinear":
            return dtype_of(node.input[1])  # its output has its scale's type
        if node.op_type == "Constant":
            return next(a.t.data_type for a in node.attribute if a.name == "value")
        if node.op_type in _SAME_TYPE_OPS:
            return dtype_of(node.input[0])
        return None

    def from_fp4(name: str) -> bool:
        node = producers.get(name)
        while node is not None and node.op_type in _SAME_TYPE_OPS | {"Cast"}:
            node = producers.get(node.input[0])
        if node is None or node.op_type != "DequantizeLinear":
            return False
        quantized = node.input[0]
        source = producers.get(quantized)
        return initializer_types.get(quantized) == TensorProto.FLOAT4E2M1 or (
            source is not None and source.op_type == "TRT_FP4DynamicQuantize"
        )

    # Rebuilt in order, each cast beside the MatMul it serves: the graph stays topologically sorted.
    ordered, added = [], 0
    for node in graph.node:
        if node.op_type != "MatMul" or not any(from_fp4(name) for name in node.input[:2]):
            ordered.append(node)
            continue
        for index, name in enumerate(node.input[:2]):
            if dtype_of(name) != TensorProto.FLOAT16:
                cast = f"{name}_to_fp16_for_{node.name}"
                ordered.append(helper.make_node("Cast", [name], [cast], name=cast, to=TensorProto.FLOAT16))
                node.input[index] = cast
                added += 1
        ordered.append(node)
        if weights_dtype == "fp32":
            result = node.output[0]
            node.output[0] = f"{result}_fp16"
            ordered.append(helper.make_node("Cast", [node.output[0]], [result], name=f"{result}_to_fp32", to=TensorProto.FLOAT))
            added += 1
    del graph.node[:]
    graph.node.extend(ordered)
    inputs = [value for value in graph.input if value.name not in initializer_types]
    del graph.input[:]
    graph.input.extend(inputs)
    return added + (one_type_where_two_meet(model) if weights_dtype == "fp16" else 0)


_ELEMENTWISE = {"Add", "Sub", "Mul", "Div"}
# Standard operators whose output type is not their first input's (None is said for them: unknown).
_TYPE_CHANGING = {
    "Shape", "Size", "ArgMax", "ArgMin", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or",
    "Xor", "IsNaN", "IsInf", "NonZero", "QuantizeLinear", "DequantizeLinear", "ConstantOfShape", "Range", "TopK",
}  # fmt: skip


def one_type_where_two_meet(model) -> int:
    """Give the FP16 graph one type where ModelOpt's clean-up left two; returns the casts changed
    or added.

    An FP16 model that computes a part in FP32 — ModernBERT's rotary embedding,
    ``(q.float() * cos.float()).to(q.dtype)``, and attention's softmax — exports a cast up to FP32
    and one back down. ModelOpt's clean-up drops some of them (it reads types recorded before the
    graph changed), and TensorRT-RTX refused the result: "/model/layers.0/attn/Mul:
    ElementWiseOperation PROD must have same input types. But they are of types Half and Float."
    Casting back down where the types meet put a cast between attention's softmax and its second
    matrix multiply, which failed TensorRT-RTX 1.7's attention fusion (a Myelin CHECK in
    mha_fusion.cpp). So the FP32 part is made FP16 where it begins: where an FP32 tensor meets an
    FP16 one (elementwise, matrix multiply), each cast up to FP32 it came from casts to FP16
    instead; an FP32 constant it came from gets a cast to FP16 where they meet. What PyTorch
    computed in FP32 there, the engine computes in FP16, as it does every other part of the model.
    """
    from onnx import TensorProto, helper

    FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
    graph = model.graph
    changed = 0
    for _ in range(100_000):  # each pass fixes one meeting; a graph has far fewer
        types = _types(graph)
        producers = {output: node for node in graph.node for output in node.output}
        meeting = next((node for node in graph.node if {types(name) for name in _operands(node)} == {FLOAT, FLOAT16}), None)
        if meeting is None:
            return changed
        wide = next(name for name in _operands(meeting) if types(name) == FLOAT)
        casts = _upcasts(wide, producers, types)
        if casts:
            for cast in casts:
                for attribute in cast.attribute:
                    if attribute.name == "to":
                        attribute.i = TensorProto.FLOAT16
            changed += len(casts)
            continue
        name = f"{wide}_to_fp16_for_{meeting.name}"
        index = list(meeting.input).index(wide)
        position = list(graph.node).index(meeting)
        graph.node.insert(position, helper.make_node("Cast", [wide], [name], name=name, to=TensorProto.FLOAT16))
        meeting.input[index] = name
        changed += 1
    raise RuntimeError("the FP16 graph's types did not settle")


def _operands(node) -> list[str]:
    """The inputs of ``node`` that must have one type: both of an elementwise operation or a
    matrix multiply, the two values of a Where."""
    if node.op_type == "Where" and len(node.input) == 3:
        return list(node.input[1:])
    if (node.op_type in _ELEMENTWISE or node.op_type == "MatMul") and len(node.input) == 2:
        return list(node.input)
    return []


def _types(graph):
    """A lookup of each tensor's element type, where the graph says it (None: unknown)."""
    from onnx import helper

    producers = {output: node for node in graph.node for output in node.output}
    known = {tensor.name: tensor.data_type for tensor in graph.initializer}
    known.update({value.name: value.type.tensor_type.elem_type for value in graph.input})

    def dtype_of(name: str) -> int | None:
        pending = [name]
        while pending:  # iteratively: a deep graph would exhaust Python's recursion
            current = pending[-1]
            if current in known:
                pending.pop()
                continue
            node = producers.get(current)
            source = None
            if node is None:
                known[current] = None
            elif node.op_type == "Cast":
                known[current] = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "to")
            elif node.op_type == "Constant":
                known[current] = next((a.t.data_type for a in node.attribute if a.name == "value"), None)
            elif node.domain or node.op_type in _TYPE_CHANGING or not node.input:
                known[current] = None
            else:
                source = node.input[1] if node.op_type == "Where" else node.input[0]
            if source is None:
                pending.pop()
            elif source in known:
                known[current] = known[source]
                pending.pop()
            else:
                pending.append(source)
        return known[name]

    return dtype_of


def _upcasts(name: str, producers, types) -> list:
    """The casts from FP16 up to FP32 that the FP32 tensor ``name`` comes from, through operations
    that keep the type. FP32 constants on the way stay: once the casts are FP16, each meets FP16
    where it is used, and is cast there."""
    from onnx import TensorProto

    found, pending, seen = [], [name], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        node = producers.get(current)
        if node is None or node.op_type == "Constant":
            continue
        if node.op_type == "Cast":
            if types(node.input[0]) == TensorProto.FLOAT16:
                found.append(node)
            continue
        pending += [source for source in node.input if source and types(source) == TensorProto.FLOAT]
    return found
