"""Strata, the elastic engine (docs/protocols.md, elastic VRAM): a mixture-of-experts server whose
expert cache, allocated in segments, is resized by ``POST /v1/vram``. It is elastic only
when started so (``--vram-elastic``, configuration ``"vram_elastic": true``), with the
segment size (``--vram-segment-mib N`` on its command line, else its configuration's
``"vram_segment_mib"``, 512 unless set, at least 64: its argv parser and server tests),
which the manifest's ``elastic.segment_mib`` must equal. Pure data."""

from __future__ import annotations

from statemachine.engines.spec import Detection, ElasticConfig, Engine

ELASTIC_FLAG = "--vram-elastic"
SEGMENT_FLAG = "--vram-segment-mib"
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
        segment_flag=SEGMENT_FLAG,
    ),
)
