"""The harness changes for upstream Mooncake's EP test on one GPU with gloo.

Imported, in every process of a test that imports mooncake.pg or
mooncake.ep (the launcher and each rank, however started), as the module
``mooncake.pg_<torch version>``: the slot of upstream's compiled Mooncake PG extension, which
upstream's ``mooncake/pg.py`` and ``mooncake/ep.py`` import and which
registers upstream's "mooncake" process-group backend. That backend is not
this project's; run_ep_test.py puts a one-line module in that slot that
imports this file instead. Upstream's files are not touched.

The changes, and only these (issue 25 item 5):
  1. Rank placement: torch.cuda.set_device(i) -> GPU i % (real GPU count), so
     both ranks share GPU 0 on a one-GPU machine (upstream calls
     set_device(local_rank)). Device count: with $MC_EP_NUM_RANKS set,
     torch.cuda.device_count() answers that number in the launching
     process only (upstream's
     mooncake-ep/tests/test_ep_grid.py spawns one rank per GPU it counts).
  2. Process-group backend: init_process_group(backend="mooncake") -> "gloo"
     (NCCL refuses two ranks on one GPU; "mooncake" is upstream's PG).
  3. gloo has no list-form all_to_all (ProcessGroupGloo implements
     alltoall_base only): dist.all_to_all, which EP's Buffer.connect() uses to
     swap QP numbers and LIDs, runs as dist.all_to_all_single on the
     concatenated tensors, then splits the result back.
  4. gloo's all_gather_into_tensor (_allgather_base) wants the output as a
     concatenation along dim 0; upstream's test passes it stacked
     ([world, *input.shape]), which NCCL accepts: the stacked output is
     handed over as its concatenated view (same memory).
Nothing else is patched: the EP buffer, kernels and checks are upstream's.
"""

import multiprocessing
import os

import torch
import torch.distributed as dist


def _install() -> None:
    if getattr(dist, "_mooncake_ep_harness", False):
        return
    dist._mooncake_ep_harness = True

    # 1. rank placement, device count
    set_device = torch.cuda.set_device
    device_count = torch.cuda.device_count

    def _set_device(device):
        n = device_count()
        if n > 0 and isinstance(device, int):
            device = device % n
        elif (n > 0 and isinstance(device, torch.device) and device.type == "cuda"
              and device.index is not None):
            device = torch.device("cuda", device.index % n)
        return set_device(device)

    torch.cuda.set_device = _set_device
    # Only in the launching process: it spawns one rank per GPU it counts.
    # The ranks themselves (spawned children) keep the real count, which
    # torch's own lazy initialisation walks device by device.
    num_ranks = int(os.environ.get("MC_EP_NUM_RANKS") or 0)
    # A spawned rank imports the test's main module (and so this file)
    # while multiprocessing prepares it, before parent_process() is set;
    # its name is already set then.
    launcher = (multiprocessing.current_process().name == "MainProcess"
                and not getattr(multiprocessing.current_process(), "_inheriting", False))
    if num_ranks > 0 and launcher:
        torch.cuda.device_count = lambda: num_ranks

    # 2. backend
    init_process_group = dist.init_process_group

    def _init_process_group(*args, **kwargs):
        if args and args[0] == "mooncake":
            args = ("gloo",) + tuple(args[1:])
        if kwargs.get("backend") == "mooncake":
            kwargs["backend"] = "gloo"
        return init_process_group(*args, **kwargs)

    dist.init_process_group = _init_process_group

    # 3. all_to_all (list form) over all_to_all_single
    all_to_all = dist.all_to_all

    def _all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
        if dist.get_backend(group) != "gloo":
            return all_to_all(output_tensor_list, input_tensor_list, group=group,
                              async_op=async_op)
        send = torch.cat([t.reshape(-1) for t in input_tensor_list])
        out_sizes = [t.numel() for t in output_tensor_list]
        recv = torch.empty(sum(out_sizes), dtype=send.dtype, device=send.device)
        dist.all_to_all_single(recv, send, out_sizes, [t.numel() for t in input_tensor_list],
                               group=group)
        for t, part in zip(output_tensor_list, recv.split(out_sizes)):
            t.copy_(part.view_as(t))
        return None  # synchronous, as upstream calls it

    dist.all_to_all = _all_to_all

    # 4. stacked all_gather_into_tensor
    all_gather_into_tensor = dist.all_gather_into_tensor

    def _all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        if (output_tensor.dim() == input_tensor.dim() + 1 and input_tensor.dim() >= 1
                and dist.get_backend(group) == "gloo"):
            output_tensor = output_tensor.view(-1, *input_tensor.shape[1:])
        return all_gather_into_tensor(output_tensor, input_tensor, group=group,
                                      async_op=async_op)

    dist.all_gather_into_tensor = _all_gather_into_tensor


_install()
