%% @doc The job queue of couch_workers: the calls behind the `job_*'
%% functions of `couch_workers'. Job subscriptions are kept by their own
%% server, `couch_workers_jobs_subs'.
%%
%% Calls that touch the store run in the caller's process: it calls the
%% NIF with a fresh reference and waits for `{Ref, Result}' (as erlfdb's
%% `wait/2'). The store's transaction budget bounds every answer; the wait
%% gives up with `{error, timeout}' after that budget plus a margin.
%%
%% `accept/2' with a timeout waits for the Rust dispatcher, which always
%% answers by the deadline (a job, or `not_found'). The caller keeps the
%% NIF's waiter resource meanwhile: if the caller dies, the resource is
%% freed and the dispatcher drops it; a job taken for it at that very
%% moment cannot be delivered and goes back to pending. Past the deadline
%% plus a generous margin the caller abandons the waiter (and logs it
%% loudly): either nothing was delivered (and nothing will be: a job taken
%% later goes back to pending) or the answer is already on its way and is
%% received. No job is ever left running for a caller that gave up.
-module(couch_workers_jobs).

-export([
    add/4,
    add_many/2,
    accept/2,
    update/2,
    finish/2,
    finish_accept/3,
    cancel/2,
    remove/2,
    get/2,
    pending_count/1,
    subscribe/3,
    unsubscribe/1,
    fail/3,
    release/2,
    resubmit/4,
    remove/3,
    counts/1,
    types/0,
    list/2,
    wait/4,
    pause/1,
    resume/1
]).

%% The options' checks, for the calls inside a caller's transaction
%% (couch_workers_tx) and for the recurring jobs' slots
%% (couch_workers_schedules).
-export([add_opts/1, resubmit_opts/1]).

-include_lib("kernel/include/logger.hrl").

%% The largest `after' a receive takes.
-define(MAX_AFTER, 16#ffffffff).
%% Accept timeouts are capped here (about 292 million years).
-define(MAX_TIMEOUT, (1 bsl 63)).
-define(STATES, [scheduled, pending, running, finished, canceled, failed]).

%% ---- API: the calls ---------------------------------------------------------

-spec add(binary(), binary(), map(), map()) -> ok | {error, term()}.
add(Type, Id, Info, Opts) when is_binary(Type), is_binary(Id), is_map(Info), is_map(Opts) ->
    case add_opts(Opts) of
        {ok, NifOpts} -> add_nif(Type, Id, Info, NifOpts, Opts);
        {error, _} = Error -> Error
    end;
add(_Type, _Id, _Info, _Opts) ->
    erlang:error(badarg).

-spec add_many(binary(), [{binary(), map(), map()}]) -> ok | {error, term()}.
add_many(Type, Jobs) when is_binary(Type), is_list(Jobs) ->
    case nif_jobs(Jobs, [], ok) of
        {ok, NifJobs} -> couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_add_many(Ref, Type, NifJobs) end);
        {error, _} = Error -> Error
    end;
add_many(_Type, _Jobs) ->
    erlang:error(badarg).

-spec fail(map(), map(), map()) -> ok | {error, term()}.
fail(Job, Error, Opts) when is_map(Job), is_map(Error), is_map(Opts) ->
    case retry(Opts) of
        {ok, Retry} -> couch_workers_nif:call(fun(Ref) -> couch_workers_nif:budgeted(job_fail, [Ref, Job, Error, Retry]) end);
        {error, _} = Err -> Err
    end;
fail(_Job, _Error, _Opts) ->
    erlang:error(badarg).

-spec release(map(), map()) -> ok | {error, term()}.
release(Job, Opts) when is_map(Job), is_map(Opts) ->
    Info = opt(info, Opts, undefined),
    case nif_opts(maps:without([info, <<"info">>], Opts), [priority, schedule]) of
        {ok, NifOpts} when Info =:= undefined; is_map(Info) ->
            couch_workers_nif:call(fun(Ref) -> couch_workers_nif:budgeted(job_release, [Ref, Job, Info, NifOpts]) end);
        {ok, _} ->
            {error, invalid_info};
        {error, _} = Error ->
            Error
    end;
release(_Job, _Opts) ->
    erlang:error(badarg).

-spec resubmit(binary(), binary(), map(), map()) -> ok | {error, term()}.
resubmit(Type, Id, Info, Opts) when is_binary(Type), is_binary(Id), is_map(Info), is_map(Opts) ->
    case resubmit_opts(Opts) of
        {ok, NifOpts, IfVs} ->
            resubmit_nif(Type, Id, Info, NifOpts, IfVs, Opts);
        {error, _} = Error ->
            Error
    end;
resubmit(_Type, _Id, _Info, _Opts) ->
    erlang:error(badarg).

-spec remove(binary(), binary(), map()) -> ok | {error, term()}.
remove(Type, Id, Opts) when is_binary(Type), is_binary(Id), is_map(Opts) ->
    case if_vs(Opts) of
        {ok, IfVs} -> couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_remove_if(Ref, Type, Id, IfVs) end);
        {error, _} = Error -> Error
    end;
remove(_Type, _Id, _Opts) ->
    erlang:error(badarg).

-spec counts(binary()) -> #{atom() => non_neg_integer()} | {error, term()}.
counts(Type) when is_binary(Type) ->
    case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_counts(Ref, Type) end) of
        {ok, Counts} -> Counts;
        {error, _} = Error -> Error
    end;
counts(_Type) ->
    erlang:error(badarg).

-spec types() -> [binary()] | {error, term()}.
types() ->
    case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_types(Ref) end) of
        {ok, Types} -> Types;
        {error, _} = Error -> Error
    end.

-spec list(binary(), map()) -> {ok, [map()], term()} | {error, term()}.
list(Type, Opts) when is_binary(Type), is_map(Opts) ->
    States = opt(states, Opts, all),
    Limit = opt(limit, Opts, 100),
    Cont = opt(cont, Opts, undefined),
    if
        not (States =:= all orelse (is_list(States) andalso States =/= [])) ->
            {error, invalid_states};
        is_list(States) ->
            case lists:all(fun(S) -> lists:member(S, ?STATES) end, States) of
                true -> do_list(Type, States, Limit, Cont);
                false -> {error, invalid_states}
            end;
        true ->
            do_list(Type, States, Limit, Cont)
    end;
list(_Type, _Opts) ->
    erlang:error(badarg).

do_list(Type, States, Limit, Cont) ->
    case {is_integer(Limit) andalso Limit >= 1 andalso Limit =< 1000, cont(Cont)} of
        {false, _} ->
            {error, invalid_limit};
        {_, error} ->
            {error, invalid_cont};
        {true, {ok, done}} ->
            {ok, [], done};
        {true, {ok, After}} ->
            case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_list(Ref, Type, States, Limit, After) end) of
                {ok, Jobs, done} -> {ok, Jobs, done};
                {ok, Jobs, Last} -> {ok, Jobs, {?MODULE, Type, Last}};
                {error, _} = Error -> Error
            end
    end.

%% A `Cont' is opaque to callers: `{couch_workers_jobs, Type, LastId}'.
cont(undefined) -> {ok, undefined};
cont(done) -> {ok, done};
cont({?MODULE, _Type, Last}) when is_binary(Last) -> {ok, Last};
cont(_) -> error.

%% Waits on a subscription of its own: the job's changes are pushed.
%% Changes that commit close together can reach it as one (the watcher
%% reads the job as it is when it looks), so a state held only between
%% two of them is not seen as such; the record still shows that it was
%% held (`passed/3'), and the wait answers then, with the job as it is.
-spec wait(binary(), binary(), [atom()], timeout()) -> {ok, map()} | {error, term()}.
wait(Type, Id, States, Timeout) when is_binary(Type), is_binary(Id), is_list(States) ->
    ValidTimeout = Timeout =:= infinity orelse (is_integer(Timeout) andalso Timeout >= 0),
    ValidStates = States =/= [] andalso lists:all(fun(S) -> lists:member(S, ?STATES) end, States),
    if
        not ValidStates ->
            {error, invalid_states};
        not ValidTimeout ->
            {error, invalid_timeout};
        true ->
            case subscribe(Type, Id, self()) of
                {ok, Sub, Job} ->
                    Deadline =
                        case Timeout of
                            infinity -> infinity;
                            _ -> now_ms() + Timeout
                        end,
                    try
                        wait_loop(Sub, Job, States, Deadline)
                    after
                        unsubscribe(Sub)
                    end;
                {error, _} = Error ->
                    Error
            end
    end;
wait(_Type, _Id, _States, _Timeout) ->
    erlang:error(badarg).

wait_loop(Sub, #{state := State} = Job, States, Deadline) ->
    case lists:member(State, States) of
        true -> {ok, Job};
        false -> wait_next(Sub, Job, States, Deadline)
    end.

wait_next(Sub, Job, States, Deadline) ->
    After =
        case Deadline of
            infinity -> infinity;
            _ -> min(max(0, Deadline - now_ms()), ?MAX_AFTER)
        end,
    receive
        {couch_workers_job, Sub, removed} ->
            {error, not_found};
        {couch_workers_job, Sub, Next} ->
            case passed(Job, Next, States) of
                true -> {ok, Next};
                false -> wait_loop(Sub, Next, States, Deadline)
            end
    after After ->
        case Deadline =/= infinity andalso now_ms() >= Deadline of
            true -> {error, timeout};
            false -> wait_next(Sub, Job, States, Deadline)
        end
    end.

%% Whether the job went through `running' or `pending', when `States'
%% has them, between two looks at it (`Prev', then `Next', in neither of
%% which it is in `States'), as its record shows. `attempts' grows only by
%% an accept: a larger count means it was accepted since, so it was
%% `running', and `pending' (or a due scheduled job, which reads as
%% pending) just before. A job that is `finished' or `failed' now, in a
%% record changed since a look that saw it neither running nor in that
%% same end (a resubmit ran it again, resetting `attempts'), was accepted
%% since too: only a run ends so. What the record cannot show: a run
%% followed by a resubmit between the two looks that leaves the job
%% queued again (`attempts' reset), and an ended state left that fast (a
%% wait on `finished' misses a job finished and resubmitted between two
%% looks; couch_jobs' wait misses it too).
passed(#{attempts := A0, state := S0, vs := V0}, #{attempts := A1, state := S1, vs := V1}, States) ->
    Accepted =
        A1 > A0 orelse
            ((S1 =:= finished orelse S1 =:= failed) andalso V1 =/= V0 andalso S0 =/= running),
    Accepted andalso (lists:member(running, States) orelse lists:member(pending, States));
passed(_Prev, _Next, _States) ->
    false.

-spec pause(binary()) -> ok | {error, term()}.
pause(Type) when is_binary(Type) ->
    couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_set_paused(Ref, Type, true) end);
pause(_Type) ->
    erlang:error(badarg).

-spec resume(binary()) -> ok | {error, term()}.
resume(Type) when is_binary(Type) ->
    couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_set_paused(Ref, Type, false) end);
resume(_Type) ->
    erlang:error(badarg).

-spec accept(term(), map()) -> {ok, map()} | {error, term()}.
accept(WorkerRef, Opts) when is_map(Opts) ->
    case accept_timeout(Opts) of
        {ok, Timeout} ->
            %% The registration itself, not only its id: a wait that
            %% outlives it takes nothing of a later registration's.
            case couch_workers_local:registration(WorkerRef) of
                {ok, Type, Id, Reg} -> do_accept(Type, Id, Reg, Timeout);
                error -> {error, not_found}
            end;
        error ->
            {error, invalid_timeout}
    end;
accept(_WorkerRef, _Opts) ->
    erlang:error(badarg).

-spec update(map(), map()) -> {ok, map()} | {error, term()}.
update(Job, Info) when is_map(Job), is_map(Info) ->
    couch_workers_nif:call(fun(Ref) -> couch_workers_nif:budgeted(job_update, [Ref, Job, Info]) end);
update(_Job, _Info) ->
    erlang:error(badarg).

-spec finish(map(), map()) -> ok | {error, term()}.
finish(Job, Result) when is_map(Job), is_map(Result) ->
    couch_workers_nif:call(fun(Ref) -> couch_workers_nif:budgeted(job_finish, [Ref, Job, Result]) end);
finish(_Job, _Result) ->
    erlang:error(badarg).

-spec finish_accept(map(), map(), reference()) -> {ok, map() | none} | {error, term()}.
finish_accept(Job, Result, WorkerRef) when is_map(Job), is_map(Result), is_reference(WorkerRef) ->
    case couch_workers_local:registration(WorkerRef) of
        {ok, Type, Id, Reg} ->
            Ref = make_ref(),
            case couch_workers_nif:budgeted(job_finish_accept, [Ref, Job, Result, Reg]) of
                {ok, Waiter} ->
                    %% As a job_accept with timeout 0: the answer comes within
                    %% the store's budget; one that never comes is abandoned,
                    %% and a job taken for it goes back to pending.
                    Deadline = now_ms() + 2 * couch_workers_app:call_timeout(),
                    wait_accept(Ref, Waiter, Deadline, Type, Id);
                {error, _} = Error ->
                    Error
            end;
        error ->
            %% No registration to take for: the finish alone.
            case finish(Job, Result) of
                ok -> {ok, none};
                {error, _} = Error -> Error
            end
    end;
finish_accept(_Job, _Result, _WorkerRef) ->
    erlang:error(badarg).

-spec cancel(binary(), binary()) -> ok | {error, term()}.
cancel(Type, Id) when is_binary(Type), is_binary(Id) ->
    couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_cancel(Ref, Type, Id) end);
cancel(_Type, _Id) ->
    erlang:error(badarg).

-spec remove(binary(), binary()) -> ok | {error, term()}.
remove(Type, Id) when is_binary(Type), is_binary(Id) ->
    couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_remove(Ref, Type, Id) end);
remove(_Type, _Id) ->
    erlang:error(badarg).

-spec get(binary(), binary()) -> {ok, map()} | {error, term()}.
get(Type, Id) when is_binary(Type), is_binary(Id) ->
    couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_get(Ref, Type, Id) end);
get(_Type, _Id) ->
    erlang:error(badarg).

-spec pending_count(binary()) -> non_neg_integer() | {error, term()}.
pending_count(Type) when is_binary(Type) ->
    case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_pending_count(Ref, Type) end) of
        {ok, N} -> N;
        {error, _} = Error -> Error
    end;
pending_count(_Type) ->
    erlang:error(badarg).

%% ---- API: subscriptions -----------------------------------------------------

-spec subscribe(binary(), binary(), pid()) -> {ok, reference(), map()} | {error, term()}.
subscribe(Type, Id, Pid) ->
    couch_workers_jobs_subs:subscribe(Type, Id, Pid).

-spec unsubscribe(term()) -> ok.
unsubscribe(Ref) ->
    couch_workers_jobs_subs:unsubscribe(Ref).

%% ---- internal: calls ----------------------------------------------------------

%% `timeout' (atom or binary key): ms, a non-negative integer or
%% `infinity', default 0.
accept_timeout(Opts) ->
    case opt(timeout, Opts, 0) of
        infinity -> {ok, ?MAX_TIMEOUT};
        T when is_integer(T), T >= 0 -> {ok, min(T, ?MAX_TIMEOUT)};
        _ -> error
    end.

%% The options of `add/4': every option, `keep' defaulting to the app
%% env's `job_keep_s'.
-spec add_opts(map()) -> {ok, couch_workers_nif:job_opts()} | {error, term()}.
add_opts(Opts) ->
    case nif_opts(Opts, [priority, schedule, max_attempts, keep]) of
        {ok, {P, S, M, undefined}} ->
            case couch_workers_config:get(job_keep_s) of
                {ok, Keep} -> with_unique(Opts, {ok, {P, S, M, Keep}});
                {error, _} = Error -> Error
            end;
        Other ->
            with_unique(Opts, Other)
    end.

%% The options of `resubmit/4': the NIF's options (with `unique') and
%% `if_vs'.
-spec resubmit_opts(map()) -> {ok, couch_workers_nif:job_opts(), binary() | undefined} | {error, term()}.
resubmit_opts(Opts) ->
    case if_vs(Opts) of
        {ok, IfVs} ->
            Rest = maps:without([if_vs, <<"if_vs">>], Opts),
            case with_unique(Rest, nif_opts(Rest, [priority, schedule, max_attempts, keep])) of
                {ok, NifOpts} -> {ok, NifOpts, IfVs};
                {error, _} = Error -> Error
            end;
        {error, _} = Error ->
            Error
    end.

%% The NIF's options tuple with the options only `add' and `resubmit'
%% take: `unique' as its fifth element when it is the only one given (the
%% tuple nodes before `group' read), else `{.., Unique, Group,
%% ActivityTimeout}', each `undefined' when not given. `unique' and `group'
%% are binaries, `activity_timeout' seconds (a positive integer) or
%% `infinity'; else `{error, invalid_unique | invalid_group |
%% invalid_activity_timeout}'.
with_unique(Opts, {ok, NifOpts}) ->
    Unique = opt(unique, Opts, undefined),
    Group = opt(group, Opts, undefined),
    Timeout = opt(activity_timeout, Opts, undefined),
    if
        Unique =/= undefined andalso not is_binary(Unique) -> {error, invalid_unique};
        Group =/= undefined andalso not is_binary(Group) -> {error, invalid_group};
        Timeout =/= undefined andalso Timeout =/= infinity andalso
            not (is_integer(Timeout) andalso Timeout > 0) ->
            {error, invalid_activity_timeout};
        Group =:= undefined andalso Timeout =:= undefined andalso Unique =:= undefined ->
            {ok, NifOpts};
        Group =:= undefined andalso Timeout =:= undefined ->
            {ok, erlang:append_element(NifOpts, Unique)};
        true ->
            {P, S, M, K} = NifOpts,
            {ok, {P, S, M, K, Unique, Group, cap(Timeout)}}
    end;
with_unique(_Opts, Error) ->
    Error.

%% The NIF's options tuple `{Priority, Schedule, MaxAttempts, Keep}' from
%% a caller's map, each `undefined' when not given; only the `Allowed'
%% ones are read. Every value is checked: `{error, invalid_*}' names the
%% first bad one.
nif_opts(Opts, Allowed) ->
    Get = fun(Key) ->
        case lists:member(Key, Allowed) of
            true -> opt(Key, Opts, undefined);
            false -> undefined
        end
    end,
    Delay = case lists:member(schedule, Allowed) of
        true -> opt(delay, Opts, undefined);
        false -> undefined
    end,
    RunAt = case lists:member(schedule, Allowed) of
        true -> opt(run_at, Opts, undefined);
        false -> undefined
    end,
    Priority = Get(priority),
    MaxAttempts = Get(max_attempts),
    Keep = Get(keep),
    if
        Priority =/= undefined andalso not is_integer(Priority) -> {error, invalid_priority};
        Delay =/= undefined andalso RunAt =/= undefined -> {error, invalid_schedule};
        Delay =/= undefined andalso not (is_integer(Delay) andalso Delay >= 0) -> {error, invalid_delay};
        RunAt =/= undefined andalso not (is_integer(RunAt) andalso RunAt >= 0) -> {error, invalid_run_at};
        MaxAttempts =/= undefined andalso MaxAttempts =/= infinity andalso
            not (is_integer(MaxAttempts) andalso MaxAttempts > 0) ->
            {error, invalid_max_attempts};
        Keep =/= undefined andalso Keep =/= infinity andalso not (is_integer(Keep) andalso Keep >= 0) ->
            {error, invalid_keep};
        true ->
            Schedule =
                if
                    Delay =/= undefined -> {delay, min(Delay, ?MAX_TIMEOUT)};
                    RunAt =/= undefined -> {run_at, min(RunAt, ?MAX_TIMEOUT)};
                    true -> undefined
                end,
            {ok, {Priority, Schedule, cap(MaxAttempts), cap(Keep)}}
    end.

cap(N) when is_integer(N) -> min(N, ?MAX_TIMEOUT);
cap(Other) -> Other.

%% The retry of `fail/3': `retry => false', else `delay', else the
%% default backoff of the app env.
retry(Opts) ->
    case {opt(retry, Opts, true), opt(delay, Opts, undefined)} of
        {false, _} ->
            {ok, false};
        {true, undefined} ->
            case {couch_workers_config:get(retry_backoff_base_ms), couch_workers_config:get(retry_backoff_max_ms)} of
                {{ok, Base}, {ok, Max}} -> {ok, {backoff, Base, Max}};
                {{error, _} = Error, _} -> Error;
                {_, {error, _} = Error} -> Error
            end;
        {true, D} when is_integer(D), D >= 0 ->
            {ok, {delay, min(D, ?MAX_TIMEOUT)}};
        {true, _} ->
            {error, invalid_delay};
        {_, _} ->
            {error, invalid_retry}
    end.

%% ---- if_leader: add and resubmit fenced by a leadership (couch_workers_leader)

add_nif(Type, Id, Info, NifOpts, Opts) ->
    case couch_workers_leader:fence(Opts) of
        {ok, undefined} ->
            couch_workers_nif:call(fun(Ref) -> couch_workers_nif:budgeted(job_add, [Ref, Type, Id, Info, NifOpts]) end);
        {ok, Fence} ->
            couch_workers_leader:add(Type, Id, Info, NifOpts, Fence);
        {error, _} = Error ->
            Error
    end.

resubmit_nif(Type, Id, Info, NifOpts, IfVs, Opts) ->
    case couch_workers_leader:fence(Opts) of
        {ok, undefined} ->
            couch_workers_nif:call(fun(Ref) ->
                couch_workers_nif:budgeted(job_resubmit, [Ref, Type, Id, Info, NifOpts, IfVs])
            end);
        {ok, Fence} ->
            couch_workers_leader:resubmit(Type, Id, Info, NifOpts, IfVs, Fence);
        {error, _} = Error ->
            Error
    end.

%% `if_vs' (atom or binary key): a job's `vs' binary.
if_vs(Opts) ->
    case opt(if_vs, Opts, undefined) of
        undefined -> {ok, undefined};
        <<_:96>> = VS -> {ok, VS};
        _ -> {error, invalid_vs}
    end.

opt(Key, Opts, Default) ->
    case Opts of
        #{Key := V} -> V;
        #{} -> maps:get(atom_to_binary(Key), Opts, Default)
    end.

%% [{Id, Info, Opts}] to the NIF's [{Id, Info, NifOpts}]: every shape is
%% checked (badarg) before a bad option is reported.
nif_jobs([], Acc, ok) ->
    {ok, lists:reverse(Acc)};
nif_jobs([], _Acc, Error) ->
    Error;
nif_jobs([{Id, Info, Opts} | Rest], Acc, Status) when is_binary(Id), is_map(Info), is_map(Opts) ->
    case add_opts(Opts) of
        {ok, NifOpts} -> nif_jobs(Rest, [{Id, Info, NifOpts} | Acc], Status);
        {error, _} = Error when Status =:= ok -> nif_jobs(Rest, Acc, Error);
        {error, _} -> nif_jobs(Rest, Acc, Status)
    end;
nif_jobs(_, _Acc, _Status) ->
    erlang:error(badarg).

do_accept(Type, Id, Reg, Timeout) ->
    Ref = make_ref(),
    case couch_workers_nif:job_accept(Ref, Type, Reg, Timeout) of
        {ok, Waiter} ->
            %% The dispatcher answers by the deadline; a transaction in
            %% flight may add up to the store's budget.
            Deadline = now_ms() + Timeout + 2 * couch_workers_app:call_timeout(),
            wait_accept(Ref, Waiter, Deadline, Type, Id);
        {error, _} = Error ->
            Error
    end.

wait_accept(Ref, Waiter, Deadline, Type, Id) ->
    Left = max(0, Deadline - now_ms()),
    receive
        {Ref, Result} -> Result
    after min(Left, ?MAX_AFTER) ->
        case now_ms() >= Deadline of
            false -> wait_accept(Ref, Waiter, Deadline, Type, Id);
            true -> abandon_accept(Ref, Waiter, Type, Id)
        end
    end.

abandon_accept(Ref, Waiter, Type, Id) ->
    case couch_workers_nif:job_accept_abandon(Waiter) of
        abandoned ->
            %% Nothing was delivered, and nothing will be: a job taken for
            %% this waiter from now on goes back to pending.
            ?LOG_ERROR(#{what => job_accept_unanswered, type => short(Type), worker => short(Id)}),
            {error, timeout};
        delivered ->
            %% The answer is on its way (sent right after the state
            %% changed); if it never comes, its send failed and a job in
            %% it went back to pending.
            receive
                {Ref, Result} -> Result
            after couch_workers_app:call_timeout() ->
                ?LOG_ERROR(#{what => job_accept_answer_lost, type => short(Type), worker => short(Id)}),
                {error, timeout}
            end
    end.

now_ms() ->
    erlang:monotonic_time(millisecond).

%% Ids and types in log events, cut to a readable length.
short(<<Head:64/binary, _, _/binary>>) -> <<Head/binary, "...">>;
short(Bin) -> Bin.
