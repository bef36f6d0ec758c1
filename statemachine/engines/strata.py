"""Strata, the elastic engine (docs/protocols.md, elastic VRAM): a mixture-of-experts server whose
expert cache, allocated in segments, is resized by ``POST /v1/vram``. It is elastic only
when started so (``--vram-elastic``, configuration ``"vram_elastic": true``), with the
segment size that only its configuration sets (``"vram_segment_mib"``, 512 unless set, at
least 64; the engine has no flag for it), which the manifest's ``elastic.segment_mib``
must equal. Pure data."""

from __future__ import annotations

from statemachine.engines.spec import Detection, ElasticConfig, Engine

ELASTIC_FLAG = "--vram-elastic"
#: the segment size the engine takes when none is set
DEFAULT_SEGMENT_MIB = 512

ENGINE = Engine(
    name="strata",
    display="Strata",
    detection=Detection(image_words=("strata",)),
    elastic=ElasticConfig(
        flag=ELASTIC_FLAG,
        key="vram_elastic",
        segment_key="vram_segment_mib",
        default_segment_mib=DEFAULT_SEGMENT_MIB,
    ),
)
