"""Limits on what clients may use: per-tenant quotas (:mod:`.quotas`, shared through Redis by
:mod:`.redis_quotas`), engine slots shared fairly (:mod:`.fairness`) and the input byte rate
(:mod:`.input_rate`).
"""
