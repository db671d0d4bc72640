"""What to draft each step, and what it costs.

* ``controller``: the one owner of the choice (drafter, draft length, chain or
  tree, or plain decoding), by expected tokens per unit of time;
* ``costs``: the cost model (a step's time from the measured costs);
* ``estimates``: acceptance estimates, updated from what each step verified;
* ``measure``: measuring a context's costs, and the cache those measurements
  are kept in.
"""
