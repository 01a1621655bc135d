"""A GPU cluster in a box for development, demos and tests.

`tessera.devcluster.apiserver.ApiServer` is the emulated Kubernetes API server (kmock-based, loopback).
"""
