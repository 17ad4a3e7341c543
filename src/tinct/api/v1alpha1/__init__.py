"""tinct.io/v1alpha1: ModelVersion and GrayRelease."""

from tinct.api.crd import CustomResource, PrinterColumn
from tinct.api.v1alpha1.common import API_VERSION, GROUP, VERSION, Condition, ObjectMeta, set_condition
from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseSpec, GrayReleaseStatus
from tinct.api.v1alpha1.modelversion import ModelVersion, ModelVersionSpec, ModelVersionStatus

_AGE = PrinterColumn("Age", ".metadata.creationTimestamp", type="date")

MODELVERSION = CustomResource(
    group=GROUP,
    version=VERSION,
    kind="ModelVersion",
    plural="modelversions",
    short_names=("mv",),
    spec=ModelVersionSpec,
    status=ModelVersionStatus,
    columns=(
        PrinterColumn("Model", ".spec.model"),
        PrinterColumn("Version", ".spec.version"),
        PrinterColumn("Phase", ".status.phase"),
        _AGE,
        PrinterColumn("Runtime", ".spec.runtime", priority=1),
        PrinterColumn("Message", ".status.message", priority=1),
    ),
)

GRAYRELEASE = CustomResource(
    group=GROUP,
    version=VERSION,
    kind="GrayRelease",
    plural="grayreleases",
    short_names=("gr",),
    spec=GrayReleaseSpec,
    status=GrayReleaseStatus,
    columns=(
        PrinterColumn("Stable", ".spec.stable.modelVersion"),
        PrinterColumn("Candidate", ".spec.candidate.modelVersion"),
        PrinterColumn("Step", ".status.progress", description="The step in force, e.g. 2/4."),
        PrinterColumn(
            "Weight",
            ".status.candidateWeight",
            type="number",
            description="Largest candidate weight in force.",
        ),
        PrinterColumn(
            "Analysis",
            ".status.lastAnalysis.verdict",
            description="Verdict of the last analysis: Pass, Fail, Inconclusive or Error.",
        ),
        PrinterColumn(
            "Table", ".status.routing.version", type="integer", description="Routing table version."
        ),
        PrinterColumn("Phase", ".status.phase"),
        _AGE,
        PrinterColumn("Message", ".status.message", priority=1),
    ),
)

RESOURCES = (MODELVERSION, GRAYRELEASE)

__all__ = [
    "API_VERSION",
    "GRAYRELEASE",
    "GROUP",
    "MODELVERSION",
    "RESOURCES",
    "VERSION",
    "Condition",
    "GrayRelease",
    "GrayReleaseSpec",
    "GrayReleaseStatus",
    "ModelVersion",
    "ModelVersionSpec",
    "ModelVersionStatus",
    "ObjectMeta",
    "set_condition",
]
