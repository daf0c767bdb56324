"""The reference simulator's paged KV and prefix cache on colocated workers (see
``reference_sim``'s docstring for the rules as written here): one iteration at a time, the
block pool as counts and a least-recently-freed clock."""

from __future__ import annotations

from reference_sim import Reference

from pytest_prefill.sim import LAB


class Paged(Reference):
    """Paged KV (and the prefix cache) on colocated workers, one iteration at a time."""

    def __init__(self, cost, chunk=None, engine=LAB):
        super().__init__(cost, chunk, None, engine)
        self.b = engine.kv_block_tokens
        self.clock = 0  # admissions and frees counted, for "latest" and "least recent"

    def cap_of(self, w):  # the blocks of w's pool
        return self.cap

    def blocks(self, tokens):
        return -(-tokens // self.b)

    # -- the pool: own blocks per admitted request, cached blocks {id: [sharers, freed at]}
    def used(self, w):
        return sum(a["own"] for a in w.adm.values()) + len(w.cache) * (self.E // self.b)

    def evictable(self, w, keep=()):
        return [k for k, (n, _) in w.cache.items() if n == 0 and k not in keep]

    def room(self, w, keep=()):
        return self.cap_of(w) - self.used(w) + len(self.evictable(w, keep)) * (self.E // self.b)

    def alloc(self, w, r, tokens):
        a = w.adm[r.id]
        need = max(0, self.blocks(tokens - len(a["shared"]) * self.E) - a["own"])
        if self.room(w) < need:
            return False
        while self.cap_of(w) - self.used(w) < need:  # evict the least recently freed
            del w.cache[min(self.evictable(w), key=lambda k: w.cache[k][1])]
        a["own"] += need
        return True

    def unshare(self, w, ids):
        for k in reversed(ids):
            w.cache[k][0] -= 1
            if w.cache[k][0] == 0:
                self.clock += 1
                w.cache[k][1] = self.clock

    def release(self, w, r):
        a = w.adm.pop(r.id)
        self.unshare(w, a["shared"])
        w.admitted -= 1

    def preempt(self, w, t):
        rid = max(w.adm, key=lambda k: w.adm[k]["seq"])
        r = w.adm[rid]["r"]
        w.waiting = [e for e in w.waiting if e[0] is not r]
        if r in w.running:
            w.running.remove(r)
        self.release(w, r)
        w.pending.appendleft(r)
        self.preempted.setdefault(rid, []).append(t)
        w.now_preempted = True
        return r

    # -- one worker's next iteration ------------------------------------------------------
    def compose(self, w, mode, t):
        w.running += w.joining
        w.joining = []
        w.now_preempted = False
        rows = [] if mode == "shared" else self.rows(w, t)
        pieces = self.paged_pieces(w, mode, rows, t)
        if mode == "shared" and not pieces:
            rows = self.rows(w, t)
        if not pieces and not rows:
            return None
        kv = sum(r.prompt_len + self.emitted[r.id] for r in rows)
        return pieces, rows, kv

    def rows(self, w, t):
        rows, i = list(w.running), 0
        while i < len(rows):
            r = rows[i]
            if self.alloc(w, r, r.prompt_len + self.emitted[r.id]):
                i += 1
                continue
            v = self.preempt(w, t)
            if v in rows:
                if rows.index(v) < i:
                    i -= 1
                rows.remove(v)
        return rows

    def paged_pieces(self, w, mode, rows, t):
        whole = mode != "chunked"
        room = self.B - len(rows)
        if not whole and self.chunk is not None:
            room = min(room, self.chunk)
        pieces = []
        for entry in list(w.waiting):
            r, done, target = entry
            if room <= 0:
                break
            if r.id not in w.adm:
                continue
            n = min(target - done, room)
            while not self.alloc(w, r, done + n):
                v = self.preempt(w, t)
                if v in rows:
                    rows.remove(v)
                pieces = [p for p in pieces if p[0] is not v]
                if v is r:
                    break
            else:
                pieces.append((r, done, n))
                room -= n
        if not w.now_preempted:
            self.admit_new(w, whole, rows, pieces, room, t)
        return pieces

    def admit_new(self, w, whole, rows, pieces, room, t):
        while w.pending and room > 0 and w.admitted < self.S:
            r = w.pending[0]
            target = r.prompt_len + self.emitted[r.id]
            hits = 0
            if self.caching:
                most = min(len(r.prefix_blocks), r.prompt_len // self.E, (target - 1) // self.E)
                while hits < most and r.prefix_blocks[hits] in w.cache:
                    hits += 1
            done = hits * self.E
            n = target - done if whole else min(target - done, room)
            alone = n > room
            if alone and (pieces or (rows and n <= self.B)):
                break
            ids = list(r.prefix_blocks[:hits])
            if self.room(w, keep=ids) < self.blocks(n):
                break
            w.pending.popleft()
            for k in ids:
                w.cache[k][0] += 1
            self.clock += 1
            w.adm[r.id] = {"r": r, "own": 0, "shared": ids, "seq": self.clock}
            w.admitted += 1
            self.alloc(w, r, done + n)
            w.waiting.append([r, done, target])
            if r.id not in self.prefill:
                self.prefill[r.id] = [t, None, None, w.name]
                self.cached[r.id] = done
            pieces.append((r, done, n))
            room -= n
            if alone:
                rows.clear()
                break

    def start(self, w, mode, t):
        plan = self.compose(w, mode, t)
        if plan is None:
            return
        pieces, rows, kv = plan
        w.current = (pieces, rows, kv, t)
        w.until = t + self.cost(pieces, rows, kv)

    def end(self, w, t):
        pieces, rows = self.log_iteration(w, t)
        for r, done, n in pieces:
            entry = next(e for e in w.waiting if e[0] is r)
            entry[1] = done + n
            if entry[1] < entry[2]:
                continue
            w.waiting.remove(entry)
            if self.prefill[r.id][1] is None:
                self.prefill[r.id][1:3] = [t, t]
            if self.caching:
                self.enter_cache(w, r)
            if self.prefill_first and self.emit(r, t):
                self.release(w, r)
                w.routed -= 1
            else:
                w.joining.append(r)
        for r in rows:
            if self.emit(r, t):
                w.running.remove(r)
                self.release(w, r)
                w.routed -= 1
        w.current, w.until = None, None

    def enter_cache(self, w, r):
        a = w.adm[r.id]
        for k in r.prefix_blocks[len(a["shared"]) : r.prompt_len // self.E]:
            if k not in w.cache:
                w.cache[k] = [1, 0]
                a["shared"].append(k)
                a["own"] -= self.E // self.b
