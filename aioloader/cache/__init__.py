"""The tiers under the fetch stage: segments of remote files kept in memory or on disk."""
