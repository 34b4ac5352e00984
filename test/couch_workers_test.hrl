%% Named tests for foreach fixtures, as couch_jobs writes them
%% (couch_eunit.hrl): each test gets the fixture's context.
-include_lib("eunit/include/eunit.hrl").

-define(TDEF_FE(Name), fun(Ctx) -> {atom_to_list(Name), ?_test(Name(Ctx))} end).
-define(TDEF_FE(Name, Timeout), fun(Ctx) -> {atom_to_list(Name), {timeout, Timeout, ?_test(Name(Ctx))}} end).
