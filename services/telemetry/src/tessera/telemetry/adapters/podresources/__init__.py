"""The kubelet's PodResources API (v1): the vendored proto, its generated modules and a client.

See README.md here for where `api.proto` comes from and how to regenerate the modules."""
