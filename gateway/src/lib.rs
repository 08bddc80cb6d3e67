//! Patchbay gateway: an authenticated, pooled, metered relay for the OpenAI Realtime API.
