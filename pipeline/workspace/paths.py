"""Where every output of the pipeline lives, relative to the catalog's directory.

    models/<model>/<variant>.onnx             exported (and quantized/sparsified) ONNX
    engines/<toolchain>/<engine>.<ext>         built engines, with their build logs beside them
    manifests/export/<engine>.json            the export stage (shared by all toolchains)
    manifests/<toolchain>/<engine>.json       export + build + profile of one engine
    manifests/<toolchain>/<engine>@<shape>.json   … profiled at one shape point (models with several)

A cluster run that builds for several GPU types keeps each type's engines and manifests apart:
engines/<toolchain>@<gpu>/ and manifests/<toolchain>@<gpu>/ (pipeline/cluster/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.catalog import EngineRef
from pipeline.manifest import Artifact
from pipeline.workspace.artifacts import HashCache


def output_folder(toolchain: str, gpu_type: str | None = None) -> str:
    """The folder name of one toolchain's outputs, per GPU type where a cluster run targets one."""
    return f"{toolchain}@{gpu_type}" if gpu_type else toolchain


@dataclass
class Workspace:
    root: Path

    def __post_init__(self):
        self.root = Path(self.root).resolve()
        self.hashes = HashCache(self.manifests_dir / ".hash-cache.json")

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def engines_dir(self) -> Path:
        return self.root / "engines"

    @property
    def manifests_dir(self) -> Path:
        return self.root / "manifests"

    def onnx_path(self, engine: EngineRef) -> Path:
        return self.models_dir / engine.model / f"{engine.variant}.onnx"

    def reference_paths(self, engine: EngineRef) -> tuple[Path, Path]:
        """The variant's reference batch and the FP32 model's outputs for it (pipeline/measuring/accuracy.py)."""
        folder = self.models_dir / engine.model
        return folder / f"{engine.variant}.ref-input.bin", folder / f"{engine.variant}.ref-output.bin"

    def reference_point_paths(self, engine: EngineRef, point: str, inputs: list[str]) -> tuple[dict[str, Path], Path]:
        """The reference inputs at one shape point ("2x512"), by input name, and the FP32 outputs for them."""
        folder = self.models_dir / engine.model
        stem = f"{engine.variant}.ref-{point}"
        return {name: folder / f"{stem}.{name}.bin" for name in inputs}, folder / f"{stem}.output.bin"

    def export_manifest_path(self, engine: EngineRef) -> Path:
        return self.manifests_dir / "export" / f"{engine.name}.json"

    def engine_dir(self, toolchain: str, gpu_type: str | None = None) -> Path:
        return self.engines_dir / output_folder(toolchain, gpu_type)

    def manifest_path(self, toolchain: str, engine: EngineRef, gpu_type: str | None = None, shape: str | None = None) -> Path:
        """The engine's manifest, or its profile at one shape point ("2x512") for models with several."""
        name = f"{engine.name}@{shape}" if shape else engine.name
        return self.manifests_dir / output_folder(toolchain, gpu_type) / f"{name}.json"

    def relative(self, path: Path) -> str:
        path = Path(path).resolve()
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return path.as_posix()

    def artifact(self, role: str, path: Path) -> Artifact:
        path = Path(path)
        return Artifact(
            role=role,
            path=self.relative(path),
            sha256=self.hashes.sha256(path),
            size_bytes=path.stat().st_size,
        )

    def is_intact(self, artifact: Artifact) -> bool:
        """The file is still there with the content the manifest recorded."""
        path = self.root / artifact.path
        try:
            return path.stat().st_size == artifact.size_bytes and self.hashes.sha256(path) == artifact.sha256
        except OSError:
            return False
