%% @doc The soak run; scripts/soak.sh runs it.
%%
%% A controller VM (the producer and the checker; never killed) and three
%% worker nodes (separate `erl' OS processes) share one embedded store.
%% The controller adds the jobs in batches (job_add_many, keeping at most
%% `max_pending' pending), and every `kill_every' seconds kills one worker
%% node with `kill -9' (round robin) and starts it again at once, as a new
%% incarnation that registers the same worker ids. When every job has
%% been added, it stops killing, waits until every job is finished (or
%% `drain_timeout' passes), and checks by counting:
%%
%% * added: jobs whose add committed (all of 1..N, each batch checked);
%% * finished: jobs whose record says `finished' (`job_get' of every id);
%% * lost: added jobs that are not finished in the end (must be 0);
%% * finished twice: jobs for which more than one `job_finish' returned
%%   `ok' (must be 0), from the workers' finish logs.
%%
%% Store stalls: every `stall_every' seconds (0: never) an outside OS
%% process (python3's sqlite3 module) takes the store's SQLite write lock
%% (`BEGIN IMMEDIATE') and holds it for `stall_for' seconds (default 2x
%% the health timeout): no heartbeat, accept or finish can commit on any
%% node meanwhile. The liveness rule must reap no live worker then:
%%
%% * live workers reaped: `worker_reinstated' events logged by the worker
%%   nodes (a heartbeat that found its live registration reaped and
%%   registered it again; a killed node's workers are registered anew by
%%   its restart, never reinstated), plus `worker_superseded' (a live
%%   registration replaced): must be 0.
%%
%% Stuck jobs: a job `running' under a live worker that is not running it
%% (an accept whose answer no worker got, a give-back that never
%% happened): must be 0. Such a job is finished in the end all the same
%% when its worker's node is killed (the restart's registration fails it
%% over), so it is looked for while the run goes: every `stuck_look'
%% seconds the controller lists the running jobs and the registered
%% workers. A worker is live when its registration is the one of its
%% node's running incarnation (the node and incarnation are in the
%% registration's options): a killed node's registrations stay while the
%% store stalls (nothing commits, the reaper holds off) until its
%% restart's registrations commit and fail their jobs over, and the jobs
%% under them are not under a live worker. A job seen running with the
%% same `vs' under the same worker, live at every look, for `stuck_after'
%% seconds or more is a suspect; it is stuck unless that worker's own log shows it held that
%% accept (a line for the job and attempt: finished, `not_owner' or a
%% failed finish; a finish retried through a store stall can take long).
%% After the drain, a job still running under a registered worker is
%% stuck (the producer is done: no worker holds a job that long).
%% `inject_stuck' (the check's own test) makes one: a worker of the
%% controller takes a job and holds it, doing nothing, for `stuck_after'
%% plus three looks, then unregisters (the job runs again, and finishes).
%%
%% What is observable. Each worker appends `Id Node Incarnation Slot
%% Attempt' to its own file (O_APPEND, one file per worker process and
%% incarnation) right after `job_finish' returned `ok', and the job's
%% result names the same (node, incarnation, slot). A kill can fall
%% between the commit of a finish and the log line: that job is finished
%% but unlogged (counted and printed: not lost, not twice). A kill can
%% also fall after an accept, before the finish: the job runs again
%% elsewhere after failover (printed as re-runs: `attempts' > 1; that is
%% at-least-once execution, as designed). "Finished twice" is a second
%% `ok' for the same job, which fencing must make impossible; and a
%% logged `ok' whose (node, incarnation, slot) is not the one in the
%% stored result is counted with it (a finish that returned `ok' but was
%% not the one that stuck).
%%
%% A node that exits without being killed (a worker crashed) is counted
%% and printed as an unexpected exit: must be 0.
%%
%% The worker nodes (starting, killing, what runs in them):
%% `cw_soak_node'.
-module(cw_soak).

-export([main/1]).
%% For cw_soak_node.
-export([now_ms/0]).

-spec main(map()) -> no_return().
-spec now_ms() -> integer().

-import(cw_soak_node, [start_node/4, node_os_pid/1, node_alive/1, wait_gone/2, stop_nodes/1]).

-define(TYPE, <<"soak">>).

%% ---- controller ------------------------------------------------------------------

main(Opts0) ->
    Opts1 = maps:merge(
        #{
            jobs => 1000000,
            kill_every => 30,
            nodes => 3,
            workers => 8,
            batch => 10,
            add_batch => 1000,
            max_pending => 20000,
            timeout => 3,
            drain_timeout => 120,
            stuck_look => 5,
            stuck_after => 30,
            inject_stuck => false,
            stall_every => 60,
            stall_for => undefined,
            dir => "/tmp/cw_soak"
        },
        Opts0
    ),
    #{dir := Dir0, jobs := N, nodes := NNodes, kill_every := KillEvery, stall_every := StallEvery} = Opts1,
    Opts = Opts1#{stall_for := stall_for(Opts1)},
    Dir = filename:absname(Dir0),
    Store = filename:join(Dir, "store"),
    Logs = filename:join(Dir, "logs"),
    _ = file:del_dir_r(Dir),
    ok = filelib:ensure_dir(filename:join(Store, "x")),
    ok = filelib:ensure_dir(filename:join(Logs, "x")),
    ok = application:load(couch_workers),
    ok = logger:set_primary_config(level, warning),
    ok = application:set_env(couch_workers, store, {embedded, Store}),
    {ok, _} = application:ensure_all_started(couch_workers),
    out("soak: ~b jobs through ~b worker nodes (~b workers each, health timeout ~b s), "
        "one node killed with kill -9 and restarted every ~b s; store ~s",
        [N, NNodes, maps:get(workers, Opts), maps:get(timeout, Opts), KillEvery, Store]),
    case StallEvery of
        0 -> out("soak: no store stalls", []);
        _ -> out("soak: every ~b s another OS process holds the store's write lock for ~.1f s", [StallEvery, maps:get(stall_for, Opts)])
    end,
    T0 = now_ms(),
    Nodes = maps:from_list([{I, start_node(I, 1, Dir, Opts)} || I <- lists:seq(1, NNodes)]),
    put(nodes, Nodes),
    Self = self(),
    Producer = spawn_link(fun() -> Self ! {produced, produce(Opts, 1, 0)} end),
    _ =
        case maps:get(inject_stuck, Opts) of
            true -> spawn_link(fun() -> hold_one(Opts) end);
            false -> ok
        end,
    Loop = loop(Opts#{dir => Dir, store => Store}, #{
        t0 => T0,
        next_kill => T0 + KillEvery * 1000,
        kills => 0,
        victim => 1,
        produced => undefined,
        last_report => T0,
        next_stall => next_stall(T0, StallEvery),
        stalls => 0,
        next_look => T0 + maps:get(stuck_look, Opts) * 1000,
        seen => #{},
        suspects => #{},
        exits => 0
    }),
    _ = Producer,
    #{kills := Kills, stalls := Stalls, produced := {Added, AddErrors}} = Loop,
    out("soak: all ~b jobs added (~b add retries), none pending; ~b kills, ~b stalls; no more of either; draining", [
        Added, AddErrors, Kills, Stalls
    ]),
    {Drain, Drained} = drain(N, now_ms() + maps:get(drain_timeout, Opts) * 1000, Opts, Loop),
    %% Before the nodes stop (their unregisters release what they hold;
    %% they exit then).
    #{suspects := Suspects, exits := Exits} = Final = flush_port_exits(Drained),
    StuckAtEnd = running_under_live_workers(),
    stop_nodes(Dir),
    Report = check(N, Added, Logs, Suspects, StuckAtEnd),
    LiveReaped = count_in_outputs(Dir, [<<"worker_reinstated">>, <<"worker_superseded">>]),
    Elapsed = (now_ms() - T0) / 1000,
    #{finished := Finished, lost := Lost, twice := Twice, stuck := Stuck} = Report,
    out(
        "~nsoak: done in ~.1f s (~b jobs/s)~n"
        "  jobs added:          ~b~n"
        "  jobs finished:       ~b~n"
        "  lost:                ~b~n"
        "  finished twice:      ~b~n"
        "  stuck:               ~b (running under a live worker that is not running it: ~b seen during the run, ~b at the end)~n"
        "  kills (kill -9):     ~b, each followed by a restart~n"
        "  store stalls:        ~b (write lock held by another process for ~.1f s each)~n"
        "  live workers reaped: ~b (worker_reinstated/worker_superseded on nodes that were not killed)~n"
        "  nodes that exited by themselves (not killed): ~b~n"
        "  jobs seen running under a killed incarnation's registration (its restart fails them over; not stuck): ~b~n"
        "  re-runs (attempts > 1, jobs that were running on a killed node): ~b~n"
        "  finished but unlogged (kill between the finish's commit and its log line): ~b~n"
        "  finish ok logged with another writer than the stored result's: ~b~n"
        "  job_finish not_owner (a handle refused after failover): ~b~n"
        "  stuck suspects held by their worker all along (its log has the accept): ~b~n"
        "  drain: ~p",
        [
            Elapsed,
            round(Finished / max(Elapsed, 0.001)),
            Added,
            Finished,
            Lost,
            Twice,
            Stuck,
            maps:get(stuck_run, Report),
            length(StuckAtEnd),
            Kills,
            Stalls,
            maps:get(stall_for, Opts),
            LiveReaped,
            Exits,
            map_size(maps:get(under_dead, Final, #{})),
            maps:get(reruns, Report),
            maps:get(unlogged, Report),
            maps:get(wrong_writer, Report),
            maps:get(not_owner, Report),
            maps:get(suspects_held, Report),
            Drain
        ]
    ),
    case maps:get(lost_ids, Report) of
        [] -> ok;
        Ids -> out("  lost ids (first 20): ~p", [lists:sublist(Ids, 20)])
    end,
    case maps:get(twice_ids, Report) of
        [] -> ok;
        TIds -> out("  finished twice ids (first 20): ~p", [lists:sublist(TIds, 20)])
    end,
    case maps:get(stuck_jobs, Report) of
        [] -> ok;
        SIds -> out("  stuck jobs (first 20: {id, attempt, worker, s seen running}): ~p", [lists:sublist(SIds, 20)])
    end,
    _ = application:stop(couch_workers),
    halt(
        case
            Lost =:= 0 andalso Twice =:= 0 andalso Stuck =:= 0 andalso Added =:= N andalso LiveReaped =:= 0 andalso
                Exits =:= 0
        of
            true -> 0;
            false -> 1
        end
    ).

%% The controller's loop: kills and restarts on schedule, prints progress,
%% until the producer is done and nothing is pending any more (the jobs
%% of the last kill may still come back: the drain waits for those).
loop(Opts, St) ->
    case maps:get(produced, St) =/= undefined andalso couch_workers:job_pending_count(?TYPE) =:= 0 of
        true -> St;
        false -> loop_wait(Opts, St)
    end.

loop_wait(Opts, St) ->
    receive
        {produced, P} ->
            loop(Opts, St#{produced => P});
        {Port, {exit_status, Status}} when is_port(Port) ->
            loop(Opts, port_exit(Port, Status, St));
        {stall_done, Output} ->
            out("soak: ~.1f s: stall ended: ~s", [(now_ms() - maps:get(t0, St)) / 1000, string:trim(Output)]),
            loop(Opts, St)
    after 200 ->
        Now = now_ms(),
        St1 =
            case Now >= maps:get(next_kill, St) of
                true -> kill_and_restart(Opts, St);
                false -> St
            end,
        St14 =
            case Now >= maps:get(next_stall, St1) of
                true -> stall(Opts, St1);
                false -> St1
            end,
        St15 =
            case Now >= maps:get(next_look, St14) of
                true -> look(Opts, St14);
                false -> St14
            end,
        St2 =
            case Now - maps:get(last_report, St15) >= 5000 of
                true ->
                    progress(St15),
                    St15#{last_report => Now};
                false ->
                    St15
            end,
        loop(Opts, St2)
    end.

kill_and_restart(#{dir := Dir, nodes := NNodes, kill_every := KillEvery} = Opts, #{victim := V, kills := K} = St) ->
    Nodes = get(nodes),
    #{inc := Inc} = Node = maps:get(V, Nodes),
    OsPid = node_os_pid(Node),
    _ = os:cmd("kill -9 " ++ OsPid),
    wait_gone(OsPid, 10000),
    out("soak: ~.1f s: killed node n~b (incarnation ~b, OS pid ~s); restarting", [
        (now_ms() - maps:get(t0, St)) / 1000, V, Inc, OsPid
    ]),
    New = start_node(V, Inc + 1, Dir, Opts),
    put(nodes, maps:put(V, New, Nodes)),
    %% On the schedule (a restart takes a second or two of it).
    Next = max(now_ms() + 1000, maps:get(next_kill, St) + KillEvery * 1000),
    St#{kills => K + 1, victim => V rem NNodes + 1, next_kill => Next}.

%% One look for stuck jobs: the running jobs and the registered workers.
%% `seen' keeps, for each job running under a registered worker, its
%% `{Id, VS}' and since when it was seen so, as long as every look sees it
%% so; one seen so for `stuck_after' seconds becomes a suspect. A look that
%% fails (a store stall) changes nothing.
look(#{stuck_look := Every, stuck_after := After}, #{seen := Seen, suspects := Suspects} = St) ->
    Now = now_ms(),
    Next = St#{next_look => Now + Every * 1000},
    case {running_jobs(), live_workers()} of
        {{ok, Running}, {ok, Live}} ->
            %% (A change of the job changes its vs: a new entry. A job
            %% under a worker whose registration is no more a running
            %% incarnation's leaves `seen'.)
            Seen2 = maps:from_list([
                {{Id, VS}, maps:get({Id, VS}, Seen, {Now, W, A})}
             || {Id, W, VS, A} <- Running, maps:get(W, Live, absent) =:= true
            ]),
            %% Counted only, to show the case happened.
            UnderDead = lists:foldl(
                fun(Id, Acc) -> Acc#{Id => true} end,
                maps:get(under_dead, St, #{}),
                [Id || {Id, W, _VS, _A} <- Running, maps:get(W, Live, absent) =:= false]
            ),
            Suspects1 = maps:fold(
                fun({Id, _VS}, {First, W, A}, Acc) when Now - First >= After * 1000 ->
                        maps:put({Id, A}, {W, (Now - First) div 1000}, Acc);
                    (_, _, Acc) ->
                        Acc
                end,
                Suspects,
                Seen2
            ),
            Next#{seen => Seen2, suspects => Suspects1, under_dead => UnderDead};
        _ ->
            Next
    end.

%% The injected stuck job (inject_stuck).
hold_one(#{stuck_after := After, stuck_look := Every, timeout := Timeout}) ->
    Ref = couch_workers:worker_register(?TYPE, <<"probe">>, #{timeout => Timeout}, self()),
    true = is_reference(Ref),
    {ok, #{id := Id}} = take_one(Ref),
    out("soak: injected a stuck job: ~s, held without being run by worker probe", [Id]),
    timer:sleep((After + 3 * Every) * 1000),
    ok = couch_workers:worker_unregister(Ref).

take_one(Ref) ->
    case couch_workers:job_accept(Ref, #{timeout => 5000}) of
        {ok, _} = Taken -> Taken;
        {error, _} -> take_one(Ref)
    end.

%% [{Id, Worker, VS, Attempts}] of every running job.
running_jobs() ->
    running_jobs(undefined, []).

running_jobs(Cont, Acc) ->
    case couch_workers:job_list(?TYPE, #{states => [running], limit => 1000, cont => Cont}) of
        {ok, Jobs, Next} ->
            Acc1 = [{Id, W, VS, A} || #{id := Id, worker := W, vs := VS, attempts := A} <- Jobs] ++ Acc,
            case Next of
                done -> {ok, Acc1};
                _ -> running_jobs(Next, Acc1)
            end;
        {error, _} = Error ->
            Error
    end.

%% The ids of the registered workers (read from the store), each with
%% whether it is live: registered by a node incarnation whose OS process
%% runs, or by the controller itself (the injected stuck job's worker
%% names no node).
live_workers() ->
    Running = maps:from_list([
        {iolist_to_binary(io_lib:format("n~b", [I])), Inc}
     || {I, #{inc := Inc} = Node} <- maps:to_list(get(nodes)), node_alive(Node)
    ]),
    case couch_workers:workers(?TYPE) of
        Workers when is_list(Workers) ->
            {ok, maps:from_list([{Id, live_registration(O, Running)} || #{id := Id, opts := O} <- Workers])};
        {error, _} = Error ->
            Error
    end.

live_registration(#{<<"node">> := Node, <<"inc">> := Inc}, Running) ->
    maps:get(Node, Running, none) =:= Inc;
live_registration(#{}, _Running) ->
    true.

%% A node's port reported its exit: the port of a node that was killed
%% and replaced is no more in `nodes'; one still there exited by itself.
port_exit(Port, Status, #{t0 := T0} = St) ->
    case [I || {I, #{port := P}} <- maps:to_list(get(nodes)), P =:= Port] of
        [] ->
            St;
        [I] ->
            out("soak: ~.1f s: node n~b exited by itself (status ~p; its output: n~b.out)", [
                (now_ms() - T0) / 1000, I, Status, I
            ]),
            St#{exits => maps:get(exits, St, 0) + 1}
    end.

%% The unexpected exits the port messages told after the loop (the drain
%% receives none).
flush_port_exits(St) ->
    receive
        {Port, {exit_status, Status}} when is_port(Port) -> flush_port_exits(port_exit(Port, Status, St))
    after 0 -> St
    end.

%% After the drain: [{Id, Attempt, Worker, 0}] of the jobs running under a
%% registered worker (none may be: no worker holds a job that long).
running_under_live_workers() ->
    case {running_jobs(), live_workers()} of
        {{ok, Running}, {ok, Live}} ->
            [{Id, A, W, 0} || {Id, W, _VS, A} <- Running, maps:get(W, Live, absent) =:= true];
        Failed ->
            out("soak: the stuck check after the drain could not read the store: ~p", [Failed]),
            [{read_failed, 0, <<>>, 0}]
    end.

%% A store stall: another OS process holds the write lock for stall_for
%% seconds; a helper process waits for it and reports {stall_done, Output}.
stall(#{store := Store, stall_for := For, stall_every := Every}, #{t0 := T0, stalls := N} = St) ->
    Self = self(),
    File = filename:join(Store, "couch_workers.sqlite"),
    Cmd = lists:flatten(io_lib:format("python3 -c '~s' '~s' ~.3f 2>&1", [stall_holder(), File, For])),
    out("soak: ~.1f s: store stall ~b: another process takes the write lock for ~.1f s", [(now_ms() - T0) / 1000, N + 1, For]),
    _ = spawn_link(fun() -> Self ! {stall_done, os:cmd(Cmd)} end),
    St#{stalls => N + 1, next_stall => maps:get(next_stall, St) + Every * 1000}.

%% Python: take SQLite's write lock (waiting up to 30 s for a writer that
%% holds it), hold it, roll back; print how long it was held.
stall_holder() ->
    "import sqlite3, sys, time\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
    "c.execute(\"BEGIN IMMEDIATE\")\n"
    "t = time.monotonic()\n"
    "time.sleep(float(sys.argv[2]))\n"
    "c.execute(\"ROLLBACK\")\n"
    "print(\"write lock held %.2f s\" % (time.monotonic() - t))\n".

stall_for(#{stall_for := undefined, timeout := Timeout}) -> 2.0 * Timeout;
stall_for(#{stall_for := S}) when is_number(S) -> float(S).

next_stall(_T0, 0) -> infinity;
next_stall(T0, Every) -> T0 + Every * 1000.

%% Lines of the worker nodes' outputs that contain one of Words.
count_in_outputs(Dir, Words) ->
    Outs = filelib:wildcard(filename:join(Dir, "n*.out")),
    lists:sum([
        begin
            {ok, Bin} = file:read_file(F),
            length(binary:matches(Bin, Words))
        end
     || F <- Outs
    ]).

progress(#{t0 := T0, kills := K}) ->
    Pending = couch_workers:job_pending_count(?TYPE),
    Added = persistent_term:get({?MODULE, added}, 0),
    out("soak: ~.1f s: added ~b, pending ~b, kills ~b", [(now_ms() - T0) / 1000, Added, Pending, K]).

%% The producer: adds jobs 1..N in batches, keeping at most max_pending
%% pending. A batch whose add failed (timeout: commit unknown) is tried
%% again; all-or-nothing, so it is then either `ok' or `already_exists'
%% for every id (it had committed). Returns {Added, Retries}.
produce(#{jobs := N}, Next, Retries) when Next > N ->
    {N, Retries};
produce(#{jobs := N, add_batch := B, max_pending := Max} = Opts, Next, Retries) ->
    case couch_workers:job_pending_count(?TYPE) of
        P when is_integer(P), P + B =< Max ->
            Last = min(N, Next + B - 1),
            Batch = [{job_id(I), #{<<"n">> => I}, #{}} || I <- lists:seq(Next, Last)],
            case add_batch(Batch, 0) of
                {ok, R} ->
                    put_added(Last),
                    produce(Opts, Last + 1, Retries + R)
            end;
        _ ->
            timer:sleep(20),
            produce(Opts, Next, Retries)
    end.

add_batch(Batch, Tries) ->
    case couch_workers:job_add_many(?TYPE, Batch) of
        ok ->
            {ok, Tries};
        {error, {already_exists, Ids}} when Tries > 0, length(Ids) =:= length(Batch) ->
            %% The earlier try had committed.
            {ok, Tries};
        {error, Reason} when Tries < 100 ->
            out("soak: add_many failed (~p), retrying", [Reason]),
            timer:sleep(100),
            add_batch(Batch, Tries + 1)
    end.

put_added(N) ->
    %% The producer's count, read by the controller's progress lines.
    persistent_term:put({?MODULE, added}, N).

job_id(I) ->
    iolist_to_binary(io_lib:format("j~9..0b", [I])).

%% Waits until every job is finished (re-reading only those that are
%% not), or the deadline; the looks for stuck jobs go on meanwhile.
drain(N, Deadline, Opts, St) ->
    T0 = now_ms(),
    {Left, St1} = drain_loop(lists:seq(1, N), Deadline, Opts, St),
    {#{unfinished => length(Left), ms => now_ms() - T0}, St1}.

drain_loop(Ids, Deadline, Opts, St) ->
    Left = pmap_filter(fun(I) -> state(job_id(I)) =/= finished end, Ids),
    St1 =
        case now_ms() >= maps:get(next_look, St) of
            true -> look(Opts, St);
            false -> St
        end,
    case Left =:= [] orelse now_ms() > Deadline of
        true ->
            {Left, St1};
        false ->
            timer:sleep(1000),
            drain_loop(Left, Deadline, Opts, St1)
    end.

state(Id) ->
    case couch_workers:job_get(?TYPE, Id) of
        {ok, #{state := S}} -> S;
        {error, not_found} -> not_found;
        {error, _} = E -> E
    end.

%% Reads every job and every finish log; counts.
check(N, Added, Logs, Suspects, StuckAtEnd) ->
    Jobs = ets:new(jobs, [set, public]),
    pmap_each(
        fun(I) ->
            Id = job_id(I),
            Rec =
                case couch_workers:job_get(?TYPE, Id) of
                    {ok, #{state := finished, attempts := A, result := R}} -> {finished, A, writer(R)};
                    {ok, #{state := S, attempts := A}} -> {S, A, none};
                    {error, E} -> {E, 0, none}
                end,
            ets:insert(Jobs, {Id, Rec})
        end,
        lists:seq(1, N)
    ),
    Finishes = ets:new(finishes, [bag, public]),
    Held = ets:new(held, [set, public]),
    NotOwner = read_logs(Logs, Finishes, Held),
    %% A suspect is stuck unless its worker's log shows that accept held.
    StuckRun = lists:sort([
        {Id, A, W, Secs}
     || {{Id, A}, {W, Secs}} <- maps:to_list(Suspects), not ets:member(Held, {Id, A})
    ]),
    StuckJobs = lists:usort(StuckRun ++ StuckAtEnd),
    Finished = ets:select_count(Jobs, [{{'_', {finished, '_', '_'}}, [], [true]}]),
    LostIds = lists:sort([Id || {Id, {S, _, _}} <- ets:tab2list(Jobs), S =/= finished]),
    Reruns = ets:select_count(Jobs, [{{'_', {'_', '$1', '_'}}, [{'>', '$1', 1}], [true]}]),
    {TwiceIds, Unlogged, Wrong} = ets:foldl(
        fun({Id, {S, _, Writer}}, {Tw, Un, Wr}) ->
            Oks = [W || {_, W} <- ets:lookup(Finishes, Id)],
            Tw1 =
                case length(Oks) > 1 of
                    true -> [Id | Tw];
                    false -> Tw
                end,
            Un1 =
                case {S, Oks} of
                    {finished, []} -> Un + 1;
                    _ -> Un
                end,
            Wr1 = Wr + length([W || W <- Oks, W =/= Writer]),
            {Tw1, Un1, Wr1}
        end,
        {[], 0, 0},
        Jobs
    ),
    _ = Added,
    #{
        finished => Finished,
        lost => length(LostIds),
        lost_ids => LostIds,
        twice => length(TwiceIds) + Wrong,
        twice_ids => lists:sort(TwiceIds),
        stuck => length(lists:usort([Id || {Id, _, _, _} <- StuckJobs])),
        stuck_jobs => StuckJobs,
        stuck_run => length(StuckRun),
        suspects_held => map_size(Suspects) - length(StuckRun),
        reruns => Reruns,
        unlogged => Unlogged,
        wrong_writer => Wrong,
        not_owner => NotOwner
    }.

writer(#{<<"node">> := Node, <<"inc">> := Inc, <<"slot">> := Slot}) -> {Node, Inc, Slot};
writer(_) -> unknown.

%% Every finish log line `Id Node Inc Slot Attempt' into Finishes as
%% {Id, {Node, Inc, Slot}}; every line (those, and `not_owner Id Node Slot
%% Attempt', `failed Id Node Slot Attempt') into Held as {{Id, Attempt}}:
%% that accept was held by a worker. A torn last line (a kill mid-write)
%% is skipped. Returns the count of `not_owner' lines.
read_logs(Logs, Finishes, Held) ->
    {ok, Files} = file:list_dir(Logs),
    lists:foldl(
        fun(F, NotOwner) ->
            {ok, Bin} = file:read_file(filename:join(Logs, F)),
            lists:foldl(
                fun(Line, Acc) ->
                    case binary:split(Line, <<" ">>, [global]) of
                        [Id, Node, Inc, Slot, Attempt] ->
                            ets:insert(Finishes, {Id, {Node, binary_to_integer(Inc), binary_to_integer(Slot)}}),
                            ets:insert(Held, {{Id, binary_to_integer(Attempt)}}),
                            Acc;
                        [<<"not_owner">>, Id, _Node, _Slot, Attempt] ->
                            ets:insert(Held, {{Id, binary_to_integer(Attempt)}}),
                            Acc + 1;
                        [<<"failed">>, Id, _Node, _Slot, Attempt] ->
                            ets:insert(Held, {{Id, binary_to_integer(Attempt)}}),
                            Acc;
                        _ ->
                            Acc
                    end
                end,
                NotOwner,
                complete_lines(Bin)
            )
        end,
        0,
        Files
    ).

complete_lines(Bin) ->
    Parts = binary:split(Bin, <<"\n">>, [global]),
    %% The last part follows the last newline: empty, or torn.
    lists:droplast(Parts).

%% ---- helpers ---------------------------------------------------------------------------

now_ms() ->
    erlang:monotonic_time(millisecond).

out(Fmt, Args) ->
    io:format(Fmt ++ "~n", Args).

%% The elements of L for which F holds, computed by 8 processes.
pmap_filter(F, L) ->
    lists:append(pmap(fun(Chunk) -> [X || X <- Chunk, F(X)] end, chunks(L, 8))).

pmap_each(F, L) ->
    _ = pmap(fun(Chunk) -> lists:foreach(F, Chunk) end, chunks(L, 8)),
    ok.

pmap(F, Chunks) ->
    Self = self(),
    Refs = [
        begin
            R = make_ref(),
            spawn_link(fun() -> Self ! {R, F(C)} end),
            R
        end
     || C <- Chunks
    ],
    [
        receive
            {R, Res} -> Res
        end
     || R <- Refs
    ].

chunks(L, N) ->
    Size = max(1, (length(L) + N - 1) div N),
    chunks_of(L, Size).

chunks_of([], _) -> [];
chunks_of(L, Size) when length(L) =< Size -> [L];
chunks_of(L, Size) ->
    {H, T} = lists:split(Size, L),
    [H | chunks_of(T, Size)].
