"""horovod.torch.sync_batch_norm: batch normalization with the statistics of the whole batch."""
import torch

import conflux.torch as _cfx

from .mpi_ops import Sum, size


class SyncBatchNorm(torch.nn.BatchNorm1d):
    """Batch normalization with statistics over the whole global batch (all ranks) in training;
    plain batch norm at size 1 and in eval mode. Any input of 2 or more dimensions (N, C, ...), as
    Horovod's. (Built on the public BatchNorm1d, whose only 1-d part is the input check replaced
    here, rather than on torch's private _BatchNorm base.)"""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or size() == 1:
            return super().forward(input)
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        count = torch.tensor([input.numel() // c], dtype=input.dtype)
        stats = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        stats = _cfx.allreduce(stats, op=Sum)  # differentiable: backward sums the gradients
        n = stats[-1]
        mean = stats[:c] / n
        var = stats[c:2 * c] / n - mean * mean
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum if self.momentum is not None else \
                    1.0 / float(self.num_batches_tracked)
                unbiased = var * (n / (n - 1)) if n > 1 else var
                self.running_mean.mul_(1 - m).add_(mean.detach() * m)
                self.running_var.mul_(1 - m).add_(unbiased.detach() * m)
        shape = [1, c] + [1] * (input.dim() - 2)
        out = (input - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
