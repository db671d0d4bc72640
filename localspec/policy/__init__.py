"""What to draft each step, and what it costs.

* ``controller``: the one owner of the choice (drafter, draft length, chain or
  tree, or plain decoding), by expected tokens per unit of time;
* ``pricing``: what each option is expected to emit and to cost (the decision rule);
* ``probing``: when an unused drafter is tried again, and the budget that pays for it;
* ``learning``: what the controller keeps about each drafter, and how a step teaches it;
* ``decision``: a step's ``Decision`` and the tally behind the decisions (``ControllerStats``);
* ``costs``: the cost model (a step's time from the measured costs);
* ``estimates``: acceptance estimates, updated from what each step verified;
* ``measure``: measuring a context's costs, and the cache those measurements
  are kept in.
"""
