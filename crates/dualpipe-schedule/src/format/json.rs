//! JSON in the golden schema.
