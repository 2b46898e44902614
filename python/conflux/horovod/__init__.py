"""Horovod-compatible APIs on top of Conflux. Use `import conflux.horovod.torch as hvd` in place of
`import horovod.torch as hvd`; docs/migrating-from-horovod.md lists every difference."""
