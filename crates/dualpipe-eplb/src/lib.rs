//! Expert-parallel load balancing for Mixture-of-Experts models.
