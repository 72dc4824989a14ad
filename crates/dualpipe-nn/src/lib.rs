//! Layers and reference models with split backward (F / I / W) on candle-core.
