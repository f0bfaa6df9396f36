"""The budgeted runtime: cache, storage, replay, schedule, features, model loading and adapters."""
