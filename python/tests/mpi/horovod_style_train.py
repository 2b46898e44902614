"""A training script written against Horovod 0.28's documented torch API (docs/pytorch.rst style).
The only line that differs from the Horovod version is the import below
(Horovod: `import horovod.torch as hvd`). Exits non-zero / raises on failure."""
import conflux.horovod.torch as hvd

import argparse

import torch
import torch.nn.functional as F


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 32)
        self.fc2 = torch.nn.Linear(32, 2)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False)
    parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
    parser.add_argument("--clip-grad", action="store_true", default=False,
                        help="synchronize(), clip, then step() inside skip_synchronize()")
    args = parser.parse_args(argv)

    hvd.init()
    torch.manual_seed(42 + hvd.rank())  # deliberately different: broadcast_parameters fixes it
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())

    # Synthetic, linearly separable data; each rank its own shard (DistributedSampler style).
    g = torch.Generator().manual_seed(7)
    data = torch.randn(512, 10, generator=g)
    target = (data[:, 0] + data[:, 1] > 0).long()
    dataset = torch.utils.data.TensorDataset(data, target)
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=hvd.size(), rank=hvd.rank())
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler)
    shard = list(iter(sampler))

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    def metric_average(val, name):
        tensor = torch.tensor(val)
        avg_tensor = hvd.allreduce(tensor, name=name)
        return avg_tensor.item()

    losses = []
    for epoch in range(args.epochs):
        model.train()
        sampler.set_epoch(epoch)
        total = 0.0
        for batch_idx, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()
            if args.clip_grad:
                optimizer.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()
            total += loss.item()
        avg = metric_average(total / len(loader), "avg_loss")
        losses.append(avg)
        if hvd.rank() == 0:
            print("epoch %d loss %.4f" % (epoch, avg), flush=True)

    # Evaluation with a metric averaged over workers, as in Horovod's examples.
    model.eval()
    with torch.no_grad():
        correct = (model(data[shard]).argmax(1) == target[shard]).float().mean()
    accuracy = metric_average(correct.item(), "accuracy")

    # The same parameters everywhere.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0), name="params")
    same = all(torch.equal(gathered[r], gathered[0]) for r in range(hvd.size()))
    summary = hvd.allgather_object({"rank": hvd.rank(), "same": same})
    hvd.barrier()
    assert losses[-1] < losses[0], losses
    assert accuracy > 0.8, accuracy
    assert all(s["same"] for s in summary), summary
    return {"losses": losses, "accuracy": accuracy, "size": hvd.size()}


if __name__ == "__main__":
    main()
