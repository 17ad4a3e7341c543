"""Artifacts of a ModelVersion: reading, hashing, format validation, compatibility rules.

- :mod:`~tinct.artifacts.storage`: URIs (``file://``, ``s3://``, ``gs://``, ``az://``) onto
  pyarrow filesystems, and the split between a missing object and a store that is down;
- :mod:`~tinct.artifacts.hashing`: streaming SHA-256 and the per-format manifest digest;
- :mod:`~tinct.artifacts.formats`: is an ONNX, safetensors, PTX or tokenizer file what it
  claims, and the interface facts it states: one reader per format
  (:mod:`~tinct.artifacts.onnx_wire`, :mod:`~tinct.artifacts.safetensors_header`,
  :mod:`~tinct.artifacts.ptx`, :mod:`~tinct.artifacts.tokenizer`) on
  :mod:`~tinct.artifacts.reading` and :mod:`~tinct.artifacts.jsonstream`, each streaming
  its file within the caps of :mod:`~tinct.artifacts.limits`;
- :mod:`~tinct.artifacts.interface`: a version's interface from its files' facts, its digest;
- :mod:`~tinct.artifacts.contract`: differences between two interfaces, classified, and the
  semver step they need;
- :mod:`~tinct.artifacts.compat`: the quantization x runtime rules;
- :mod:`~tinct.artifacts.verify`: all of the above for one ModelVersion spec.

Nothing here knows about the lineage tables; :mod:`tinct.lineage` imports from here.
"""
