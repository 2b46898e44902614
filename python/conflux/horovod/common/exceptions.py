"""horovod.common.exceptions: the exception classes Horovod scripts catch."""


class HorovodInternalError(RuntimeError):
    """Internal error raised when a Horovod collective operation (allreduce, allgather, etc) fails.
    Instances also belong to the matching conflux error class (e.g. conflux.MismatchError)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Raised at a commit of elastic training when newcomers wait to join (conflux.elastic);
    skip_sync says whether the state sync after the new world may be skipped (agreed by all)."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class HorovodVersionMismatchError(ImportError):
    """Horovod raises it when a framework's version differs from the one it was built against;
    Conflux is built against no framework and never raises it."""

    def __init__(self, name, version, installed_version):
        super().__init__(get_version_mismatch_message(name, version, installed_version))
        self.name = name
        self.version = version
        self.installed_version = installed_version


def get_version_mismatch_message(name, version, installed_version):
    return ("Framework %s installed with version %s but found version %s." % (
        name, installed_version, version))


_internal_classes = {}


def internal_error(exc):
    """A HorovodInternalError that is also an instance of `exc`'s conflux class, with its text."""
    cls = type(exc)
    sub = _internal_classes.get(cls)
    if sub is None:
        sub = type("HorovodInternalError", (HorovodInternalError, cls), {"__module__": __name__})
        _internal_classes[cls] = sub
    return sub(str(exc))
