%% @doc Where the NIF library of couch_workers lives: `priv/' of the
%% application, found through `code:priv_dir/1' (in place, as a rebar3
%% dependency, in a reltool or relx release), or next to the ebin
%% directory of the loaded code when the app is on the path by a bare
%% `-pa' of a directory that is not named after it.
%%
%% A module of its own because it must answer when `couch_workers_nif'
%% itself cannot be loaded (its on_load failed).
-module(couch_workers_nif_lib).

-export([path/0, file/0]).

-define(LIB, "libcouch_workers_nif").

%% @doc The library's path without the extension, as `erlang:load_nif/2'
%% wants it.
-spec path() -> file:filename().
path() ->
    Priv =
        case code:priv_dir(couch_workers) of
            {error, bad_name} ->
                Ebin = filename:dirname(code:which(?MODULE)),
                filename:join(filename:dirname(Ebin), "priv");
            Dir ->
                Dir
        end,
    filename:join(Priv, ?LIB).

%% @doc The library's file.
-spec file() -> file:filename().
file() ->
    path() ++ ".so".
