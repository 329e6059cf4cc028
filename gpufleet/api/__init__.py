"""The REST API behind `gpufleet server`, its dashboard and the Python SDK (`gpufleet.client`).

`models` are the answers (pydantic, shared with the SDK); `views` builds them from the objects
the watch caches hold (pure); `access` asks Kubernetes who a caller is and what they may do;
`app` is the HTTP layer; `source` fills the caches and carries out the two writes.
"""
