//! The compute-only action CSV that torch.distributed.pipelining loads.
